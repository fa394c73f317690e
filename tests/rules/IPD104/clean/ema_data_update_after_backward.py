"""The EMA update through `.data` after backward and the step: nothing saved is still needed."""
import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    ema = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        for e, p in zip(ema.parameters(), model.parameters()):
            e.data.mul_(0.99).add_(p.data, alpha=0.01)


main()
