# mypy: ignore-errors
"""In-place keeps the data pointer and bumps the version by one per op, but metadata is not "frozen"."""

import torch

CLAIM = "an in-place op keeps data_ptr, adds 1 to _version, and leaves the tensor's metadata frozen"
SOURCE = "seed 000"


def run() -> tuple[str, str]:
    x = torch.zeros(5)
    ptr, v0, rg0, leaf0 = x.data_ptr(), x._version, x.requires_grad, x.is_leaf
    x.add_(torch.ones(5, requires_grad=True))
    same_ptr, dv = x.data_ptr() == ptr, x._version - v0
    flipped = (rg0, leaf0) != (x.requires_grad, x.is_leaf)
    return (f"data_ptr kept: {same_ptr}; version +{dv}; zeros(5).add_(w) turned requires_grad "
            f"{rg0}->{x.requires_grad} and is_leaf {leaf0}->{x.is_leaf}", "PARTLY" if same_ptr and dv == 1 and flipped else "TRUE")
