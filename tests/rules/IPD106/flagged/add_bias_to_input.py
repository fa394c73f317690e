"""`x += self.shift` at the top of forward: the augmented assignment writes the caller's batch."""
import torch
from torch import nn


class Normalize(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("shift", torch.full((8,), -0.5))
        self.fc = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x += self.shift  # expect: IPD106
        return self.fc(x)


torch.manual_seed(0)
Normalize()(torch.randn(4, 8)).sum().backward()
