# mypy: ignore-errors
""""In-place is safe after the tensor's last use" is not enough: what backward needs counts."""

import torch

CLAIM = "an in-place op on x is safe once the forward no longer uses x"
SOURCE = "seed 004"


def run() -> tuple[str, str]:
    w = torch.randn(4, requires_grad=True)
    x = w * 1
    y = torch.sin(x)  # last forward use of x; sin saved x for backward
    x.add_(1)
    try:
        y.sum().backward()
        raised = False
    except RuntimeError:
        raised = True
    return (f"after its last forward use, x.add_(1) still breaks backward (sin saved x): {raised}",
            "PARTLY" if raised else "TRUE")
