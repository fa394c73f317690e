# mypy: ignore-errors
"""Two conv branches reading x, then relu_(x): a loud error at backward."""

import torch
from torch import nn

CLAIM = "two conv branches on x followed by x.relu_() fail"
SOURCE = "seed 004"


def run() -> tuple[str, str]:
    torch.manual_seed(0)
    a, b = nn.Conv2d(2, 2, 3, padding=1), nn.Conv2d(2, 2, 3, padding=1)
    x = nn.Conv2d(2, 2, 1)(torch.randn(1, 2, 5, 5))
    out = a(x) + b(x)  # both convolutions saved x
    x.relu_()
    try:
        out.sum().backward()
        raised = False
    except RuntimeError as e:
        raised = "modified by an inplace operation" in str(e)
    return (f"backward raises the in-place error: {raised}", "TRUE" if raised else "FALSE")
