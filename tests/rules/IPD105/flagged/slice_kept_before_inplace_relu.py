"""A slice of h kept before the in-place ReLU, read after it: the slice is h's memory, now relu'd."""
import torch
from torch import nn


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        kept = h[:, :4]  # a view: no copy
        y = self.act(h)  # expect: IPD105
        return y[:, 4:] * kept  # expect-read: IPD105


torch.manual_seed(0)
Gate()(torch.randn(4, 8)).sum().backward()
