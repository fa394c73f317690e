# mypy: ignore-errors
"""Softmax saves its output: masked_fill_ or in-place dropout on the probabilities raises."""

import torch
import torch.nn.functional as F

CLAIM = "softmax's output is saved for backward, so do not modify it in place"
SOURCE = "seed 004"


def run() -> tuple[str, str]:
    w = torch.randn(2, 5, requires_grad=True)
    p = w.softmax(-1)
    p.masked_fill_(p < 0.1, 0)
    try:
        p.sum().backward()
        fill = False
    except RuntimeError:
        fill = True
    q = torch.randn(2, 5, requires_grad=True).softmax(-1)
    F.dropout(q, 0.5, training=True, inplace=True)
    try:
        q.sum().backward()
        drop = False
    except RuntimeError:
        drop = True
    return (f"masked_fill_ raises: {fill}; dropout(inplace=True) raises: {drop}", "TRUE" if fill and drop else "FALSE")
