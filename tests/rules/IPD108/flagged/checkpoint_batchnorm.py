"""The rule doc's example: a checkpointed block with BatchNorm updates its running stats twice."""
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))  # expect: IPD108


def main() -> None:
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    y = checkpoint(block, x, use_reentrant=False)
    y.sum().backward()


main()
