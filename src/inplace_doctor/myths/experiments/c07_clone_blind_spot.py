# mypy: ignore-errors
"""z = x + y, then x.add_(1): no silent wrong gradient."""

import torch

CLAIM = "after z = x + y, x.add_(1) silently corrupts the gradient (a clone() blind spot)"
SOURCE = "seed 000"


def run() -> tuple[str, str]:
    a = torch.ones(3, requires_grad=True)
    x, y = a * 1, a * 1
    z = x + y
    x.add_(1)
    z.sum().backward()
    grad = a.grad.tolist()
    b = torch.ones(3, requires_grad=True)
    x, y = b * 1, b * 1
    z = x * y
    x.add_(1)
    try:
        z.sum().backward()
        raised = False
    except RuntimeError:
        raised = True
    return (f"z = x + y: grad {grad} (exact: add saves nothing); z = x * y: backward raises: {raised}",
            "FALSE" if grad == [2.0, 2.0, 2.0] and raised else "TRUE")
