# mypy: ignore-errors
"""ReLU(inplace=True) saves only its output: exact after Linear/BN/Dropout/GELU, raises after Sigmoid/Tanh/Softmax."""

import torch
from torch import nn

CLAIM = "ReLU(inplace=True) in a Sequential is usually safe"
SOURCE = "seed 000"


def _grad(prev: nn.Module, inplace: bool) -> torch.Tensor | str:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 6), prev, nn.ReLU(inplace=inplace), nn.Linear(6, 1))
    try:
        net(torch.randn(4, 6)).sum().backward()
    except RuntimeError:
        return "raises"
    return net[0].weight.grad


def run() -> tuple[str, str]:
    out = {}
    for name, prev in (("Linear", nn.Identity()), ("BatchNorm1d", nn.BatchNorm1d(6)), ("GELU", nn.GELU()),
                       ("Sigmoid", nn.Sigmoid()), ("Tanh", nn.Tanh()), ("Softmax", nn.Softmax(-1))):
        a, b = _grad(prev, True), _grad(prev, False)
        out[name] = "raises" if isinstance(a, str) else ("exact" if isinstance(b, torch.Tensor) and torch.equal(a, b) else "differs")
    ok = [out[k] for k in ("Linear", "BatchNorm1d", "GELU")] == ["exact"] * 3 and {out[k] for k in ("Sigmoid", "Tanh", "Softmax")} == {"raises"}
    return (", ".join(f"after {k}: {v}" for k, v in out.items()), "TRUE" if ok else "FALSE")
