"""An in-place write under `torch.no_grad()` into an activation: autograd records nothing (albanD in
pytorch/pytorch#26607: under no_grad the change is not part of any gradient), so fc's gradient lacks
the factor. The pattern of issue 16 (part 2)."""
import torch
from torch import nn


class Rescaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        with torch.no_grad():
            h.mul_(2)  # expect: IPD110
        return self.head(h)  # expect-read: IPD110


torch.manual_seed(0)
Rescaled()(torch.randn(4, 8)).sum().backward()
