# mypy: ignore-errors
"""The error names the op, shape and versions; anomaly mode adds the forward traceback of the failing node."""

import warnings

import torch

CLAIM = "the error names the op, anomaly mode prints the graph path, and gradcheck scans the dependencies"
SOURCE = "seed 004"


def run() -> tuple[str, str]:
    w = torch.randn(3, requires_grad=True)
    y = w.sigmoid()
    y.mul_(2)
    try:
        y.sum().backward()
        msg = ""
    except RuntimeError as e:
        msg = str(e)
    names = "of Sigmoid" in msg and "[torch.FloatTensor [3]]" in msg and "version 1" in msg
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autograd.detect_anomaly():
            y = w.sigmoid()
            y.mul_(2)
            try:
                y.sum().backward()
            except RuntimeError:
                pass
    trace = any("Traceback of forward call" in str(c.message) for c in caught)
    return (f"message names the op that saved, the shape and the versions (not the line that overwrote): {names}; anomaly mode adds the forward traceback: {trace} "
            "(the saving line, not the overwriting one); gradcheck compares Jacobians, it scans no dependencies",
            "PARTLY" if names and trace else "TRUE")
