# mypy: ignore-errors
"""In-place is safe only if x is not a leaf and no other branch uses x."""

import torch

CLAIM = "x.relu_() is safe only if x is not a leaf and no branch (y = x * 2, z = x.mean()) uses x"
SOURCE = "seed 000"


def run() -> tuple[str, str]:
    torch.manual_seed(0)
    w = torch.randn(8, requires_grad=True)

    def loss(inplace: bool) -> torch.Tensor:
        x = w * 1
        y, z = x * 2, x.mean()  # branches that save nothing of x
        x = x.relu_() if inplace else x.relu()
        return (x.sum() + y.sum() + z).clone()

    loss(False).backward()
    ref = w.grad.clone()
    w.grad = None
    loss(True).backward()
    same = torch.equal(ref, w.grad)
    plain = torch.randn(4)  # a leaf without requires_grad
    plain.relu_()
    return (f"with y = x*2 and z = x.mean() still alive, relu_ gives bitwise the same grads: {same}; "
            "a leaf without requires_grad mutates fine", "FALSE" if same else "TRUE")
