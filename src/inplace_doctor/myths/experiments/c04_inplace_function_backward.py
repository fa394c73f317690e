# mypy: ignore-errors
"""A version mismatch does not trigger a "special backward" that injects gradients."""

import torch

CLAIM = "a version mismatch triggers InplaceFunction's special backward, which injects the right gradients"
SOURCE = "seed 000"


def run() -> tuple[str, str]:
    torch.manual_seed(0)
    w = torch.randn(64, requires_grad=True)
    (w * 3).relu().sum().backward()
    out_of_place = w.grad.clone()
    w.grad = None
    (w * 3).relu_().sum().backward()
    same = torch.equal(out_of_place, w.grad)
    s = w.sigmoid()
    s.mul_(2)
    try:
        s.sum().backward()
        raised = False
    except RuntimeError:
        raised = True
    return (
        f"relu_ grads bitwise equal to relu's: {same}; a real mismatch just raises: {raised}",
        "FALSE" if same and raised else "TRUE",
    )
