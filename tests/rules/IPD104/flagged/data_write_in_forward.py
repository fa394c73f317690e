"""A model that rescales its activation through `.data` after tanh saved it."""
import torch
from torch import nn


class Squash(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc(x))  # expect-saved: IPD104
        h.data.mul_(0.5)  # expect: IPD104
        return h


torch.manual_seed(0)
Squash()(torch.randn(2, 8)).sum().backward()
