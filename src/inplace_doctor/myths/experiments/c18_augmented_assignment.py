# mypy: ignore-errors
"""x += F(x) raises when F saved x (sin, Linear), not when F saves nothing (relu output, x * 2)."""

import torch

CLAIM = "x += F(x) raises when F needs x for its backward"
SOURCE = "seed 004"


def _raises(f) -> bool:
    w = torch.randn(5, requires_grad=True)
    x = w * 1
    x += f(x)
    try:
        x.sum().backward()
        return False
    except RuntimeError:
        return True


def run() -> tuple[str, str]:
    results = {"sin": _raises(torch.sin), "x*2": _raises(lambda t: t * 2)}
    ok = results == {"sin": True, "x*2": False}
    return (f"raises: {results}", "TRUE" if ok else "FALSE")
