# mypy: ignore-errors
"""Views alias their base; in-place through a transpose or x[:, 0] = 0 works with exact gradients."""

import torch

CLAIM = "in-place on a transposed view may error; x[:, 0] = 0 is a pitfall"
SOURCE = "seed 004"


def run() -> tuple[str, str]:
    w = torch.randn(3, 4, requires_grad=True)

    def loss(inplace: bool) -> torch.Tensor:
        x = w * 2
        if inplace:
            x.t().mul_(3)
            x[:, 0] = 0
        else:
            x = x * 3
            x = torch.cat([torch.zeros(3, 1), x[:, 1:]], dim=1)
        return (x * x).sum()

    loss(False).backward()
    ref = w.grad.clone()
    w.grad = None
    loss(True).backward()
    same = torch.equal(ref, w.grad)
    base = torch.zeros(2, 2)
    base.t()[0, 1] = 5
    aliased = base[1, 0].item() == 5
    return (f"writes through .t() and x[:, 0] = 0: grads exact: {same}; a view write reaches its base: {aliased}",
            "PARTLY" if same and aliased else "TRUE")
