"""`nn.RReLU` inside checkpointed regions whose recompute does run its kernel, and outside any: the
noise backward reads is the noise the forward drew. A later op of the region saves RReLU's output
(so the recompute goes past it); `early_stop=False` runs the whole region again; the same block in
eval mode draws nothing; without checkpoint the kernel fills the very buffer its node saved.
"""
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.act = nn.RReLU()
        self.out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.fc(x)))


class Head(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.act = nn.RReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


def main() -> None:
    torch.manual_seed(0)
    block, head = Block(), Head()
    x = torch.randn(4, 16, requires_grad=True)
    checkpoint(block, x, use_reentrant=False).pow(2).mean().backward()
    checkpoint(head, x, use_reentrant=False, early_stop=False).pow(2).mean().backward()
    head.eval()
    checkpoint(head, x, use_reentrant=False).pow(2).mean().backward()
    head.train()
    head(x).pow(2).mean().backward()


main()
