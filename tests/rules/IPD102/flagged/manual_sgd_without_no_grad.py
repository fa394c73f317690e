"""A hand-written SGD step that forgot `torch.no_grad()`: `p -= lr * p.grad` on a parameter."""
import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    model(torch.randn(3, 4)).sum().backward()
    for p in model.parameters():
        p -= 0.1 * p.grad  # expect: IPD102


main()
