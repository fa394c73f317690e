"""`h += bias` where `identity` is the same object: the residual add reads the updated values."""
import torch
from torch import nn


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.bias = nn.Parameter(torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        identity = h
        h += self.bias  # expect: IPD105
        return self.fc(h) + identity  # expect-read: IPD105


torch.manual_seed(0)
Residual()(torch.randn(4, 8)).sum().backward()
