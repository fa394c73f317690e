# mypy: ignore-errors
"""A comparison mask has no grad_fn: computing it under no_grad saves nothing."""

import torch

CLAIM = "(x > 0.5).float() keeps graph memory; computing masks under no_grad saves 12 %"
SOURCE = "seed 000"


def run() -> tuple[str, str]:
    x = torch.randn(100, requires_grad=True)
    mask = (x > 0.5).float()
    with torch.no_grad():
        mask2 = (x > 0.5).float()
    return (f"mask.grad_fn: {mask.grad_fn}; requires_grad: {mask.requires_grad}; same under no_grad: {torch.equal(mask, mask2)}",
            "FALSE" if mask.grad_fn is None else "TRUE")
