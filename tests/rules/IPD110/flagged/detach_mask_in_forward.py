"""The pattern of issue 16 (part 2), in a model: `h.detach()[mask] = 0` between two layers. The masked
entries still get gradient into `fc` as if unmasked (pytorch/pytorch#7860 shows the same for `zero_`)."""
import torch
from torch import nn


class Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h.detach()[h < 0] = 0  # expect: IPD110
        return self.head(h)  # expect-read: IPD110


torch.manual_seed(0)
Masked()(torch.randn(4, 8)).sum().backward()
