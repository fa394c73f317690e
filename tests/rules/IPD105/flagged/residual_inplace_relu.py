"""`h + relu_(h)`: the add reads h after the in-place ReLU overwrote it (computes 2 * relu(h))."""
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return h + self.act(h)  # expect: IPD105  expect-read: IPD105


torch.manual_seed(0)
Block()(torch.randn(4, 8)).sum().backward()
