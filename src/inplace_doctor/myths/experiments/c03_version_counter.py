# mypy: ignore-errors
"""+=, add_, relu_ and x[:, 0] = 0 each bump the version counter; a mismatch raises at backward."""

import torch

CLAIM = "+=, add_, relu_ and x[:, 0] = 0 bump `_version`; a mismatch with the saved version raises RuntimeError"
SOURCE = "seed 000"


def run() -> tuple[str, str]:
    w = torch.randn(2, 3, requires_grad=True)
    x = w * 1
    versions = [x._version]
    x += 1
    versions.append(x._version)
    x.add_(1)
    versions.append(x._version)
    x.relu_()
    versions.append(x._version)
    x[:, 0] = 0
    versions.append(x._version)
    y = w.sigmoid()
    y.mul_(2)
    try:
        y.sum().backward()
        raised = False
    except RuntimeError as e:
        raised = "modified by an inplace operation" in str(e)
    ok = versions == [0, 1, 2, 3, 4] and raised
    return (f"versions {versions}; overwritten saved tensor raises at backward: {raised}", "TRUE" if ok else "FALSE")
