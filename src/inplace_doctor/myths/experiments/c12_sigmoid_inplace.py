# mypy: ignore-errors
"""F.sigmoid has no inplace argument; nn.Sigmoid has no inplace option."""

import torch
import torch.nn.functional as F
from torch import nn

CLAIM = "F.sigmoid(x, inplace=True) is silently ignored; nn.Sigmoid has an inplace option"
SOURCE = "seed 000"


def run() -> tuple[str, str]:
    try:
        F.sigmoid(torch.randn(3), inplace=True)
        functional = "accepted"
    except TypeError:
        functional = "TypeError"
    try:
        nn.Sigmoid(inplace=True)
        module = "accepted"
    except TypeError:
        module = "TypeError"
    return (f"F.sigmoid(x, inplace=True): {functional}; nn.Sigmoid(inplace=True): {module}",
            "FALSE" if functional == module == "TypeError" else "TRUE")
