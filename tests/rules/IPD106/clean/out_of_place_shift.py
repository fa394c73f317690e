"""`x = x + self.shift`: a new tensor, the caller's batch is untouched."""
import torch
from torch import nn


class Normalize(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("shift", torch.full((8,), -0.5))
        self.fc = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.shift
        return self.fc(x)


torch.manual_seed(0)
Normalize()(torch.randn(4, 8)).sum().backward()
