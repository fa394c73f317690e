# mypy: ignore-errors
"""x.detach() shares storage and version counter: an in-place op on it is not safe."""

import torch

CLAIM = "x.detach() followed by ReLU(inplace=True) is safe"
SOURCE = "seed 000"


def run() -> tuple[str, str]:
    w = torch.randn(6, requires_grad=True)
    x = w.tanh()  # TanhBackward saves its output
    d = x.detach()
    shares = d.data_ptr() == x.data_ptr()
    d.relu_()
    try:
        x.sum().backward()
        raised = False
    except RuntimeError:
        raised = True
    return (f"detach shares memory: {shares}; backward through x then raises: {raised}",
            "FALSE" if shares and raised else "TRUE")
