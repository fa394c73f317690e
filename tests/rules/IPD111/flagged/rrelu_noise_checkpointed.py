"""A block ending in `nn.RReLU` checkpointed non-reentrantly: the recompute stops before RReLU's
kernel draws the noise its node saved, so backward reads an uninitialised buffer; the forward is
bit-exact, the gradients are not (pytorch/pytorch#193671).
"""
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.act = nn.RReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))  # expect: IPD111


def main() -> None:
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(4, 16, requires_grad=True)
    y = checkpoint(block, x, use_reentrant=False)
    y.pow(2).mean().backward()


main()
