"""The rule doc's example: `x + act(x)` (IPD105), on a batch the caller uses again (IPD106)."""
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(x)  # expect: IPD105  expect: IPD106  expect-read: IPD105


batch = torch.randn(4, 8)
out = Block()(batch)
seen = batch.mean().item()  # the caller reads its batch again
