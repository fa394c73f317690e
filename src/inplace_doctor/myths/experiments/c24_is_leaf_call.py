# mypy: ignore-errors
"""`x.is_leaf` is a property: the seed's `x.is_leaf()` debug print raises TypeError."""

import torch

CLAIM = "print(x.is_leaf()) shows whether x is a leaf"
SOURCE = "seed 000"


def run() -> tuple[str, str]:
    x = torch.randn(2, requires_grad=True)
    try:
        x.is_leaf()  # type: ignore[operator]
        outcome = "works"
    except TypeError as e:
        outcome = f"TypeError: {e}"
    return (outcome, "FALSE" if outcome.startswith("TypeError") else "TRUE")
