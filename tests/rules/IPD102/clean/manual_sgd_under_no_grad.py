"""The same hand-written SGD step, under `torch.no_grad()` as intended."""
import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    model(torch.randn(3, 4)).sum().backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad


main()
