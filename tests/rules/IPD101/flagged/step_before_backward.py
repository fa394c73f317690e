"""GAN-style ordering bug: the optimizer steps the weights a pending backward still needs."""
import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 4)
    first = model(x).pow(2).mean()
    first.backward(retain_graph=True)
    second = model(x).mean()  # expect-saved: IPD101
    opt.step()  # expect: IPD101
    second.backward()


main()
