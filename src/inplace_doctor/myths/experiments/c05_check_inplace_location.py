# mypy: ignore-errors
"""The "also used in another computation" error the seed quotes is not a libtorch message."""

from pathlib import Path

import torch

CLAIM = 'check_inplace walks next_functions and raises "... also used in another computation"'
SOURCE = "seed 000"


def run() -> tuple[str, str]:
    lib = Path(torch.__file__).parent / "lib"
    needle = b"also used in another computation"
    found = False
    for so in sorted(lib.glob("libtorch*.so*")):
        with open(so, "rb") as f:
            if needle in f.read():
                found = True
                break
    leaf = b"a leaf Variable that requires grad is being used in an in-place operation"
    has_leaf = any(leaf in so.read_bytes() for so in sorted(lib.glob("libtorch*.so*")))
    return (f"quoted string in libtorch: {found}; the real leaf check message is: {has_leaf}",
            "FALSE" if not found and has_leaf else "TRUE")
