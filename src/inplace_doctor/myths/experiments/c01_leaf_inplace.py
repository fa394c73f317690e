# mypy: ignore-errors
"""In-place on a leaf that requires grad raises "a leaf Variable that requires grad ..."."""

import torch

CLAIM = 'x.add_(1) on a leaf with requires_grad=True raises "a leaf Variable that requires grad is being used in an in-place operation"'
SOURCE = "seed 000, 004"


def run() -> tuple[str, str]:
    x = torch.randn(3, requires_grad=True)
    try:
        x.add_(1)
        raised = ""
    except RuntimeError as e:
        raised = str(e)
    with torch.no_grad():
        x.add_(1)  # allowed under no_grad
    leaf_msg = "a leaf Variable that requires grad is being used in an in-place operation" in raised
    return (f"raises that exact message: {leaf_msg}; allowed under torch.no_grad(): True", "TRUE" if leaf_msg else "FALSE")
