# mypy: ignore-errors
"""BatchNorm followed by ReLU(inplace=True) does not corrupt running statistics."""

import torch
from torch import nn

CLAIM = "BN followed by ReLU(inplace=True) corrupts running_mean in eval; running_mean is a Parameter"
SOURCE = "seed 000"


def run() -> tuple[str, str]:
    def train(inplace: bool) -> nn.Module:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(inplace=inplace), nn.Flatten(), nn.LazyLinear(2))
        net(torch.randn(2, 3, 8, 8))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(20):
            opt.zero_grad()
            net(torch.randn(4, 3, 8, 8)).sum().backward()
            opt.step()
        return net

    a, b = train(True), train(False)
    same = all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    is_buffer = "running_mean" in dict(a[1].named_buffers())
    return (f"after 20 steps every weight and running statistic is bitwise equal: {same}; running_mean is a buffer: "
            f"{is_buffer}", "FALSE" if same and is_buffer else "TRUE")
