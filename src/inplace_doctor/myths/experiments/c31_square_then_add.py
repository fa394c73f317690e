# mypy: ignore-errors
"""y = x ** 2, then x.add_(1): backward raises (pow saved x)."""

import torch

CLAIM = "y = x ** 2 followed by x.add_(1) makes backward raise"
SOURCE = "seed 004"


def run() -> tuple[str, str]:
    w = torch.randn(3, requires_grad=True)
    x = w * 1
    y = x ** 2
    x.add_(1)
    try:
        y.sum().backward()
        raised = False
    except RuntimeError as e:
        raised = "modified by an inplace operation" in str(e)
    return (f"raises the in-place error: {raised}", "TRUE" if raised else "FALSE")
