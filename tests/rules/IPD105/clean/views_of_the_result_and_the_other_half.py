"""Views made after the in-place ReLU, of what it returned, and a half it never wrote: all read what was meant."""
import torch
from torch import nn


class Halves(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        a, b = h[:, ::2], h[:, 1::2]  # interleaved halves of one memory
        a = self.act(a)
        first = a[:, :2].reshape(-1)  # views of the result, made after the write
        return (a * b).sum() + first.sum() + b.size(1) * a.shape[0]


torch.manual_seed(0)
Halves()(torch.randn(4, 8)).backward()
