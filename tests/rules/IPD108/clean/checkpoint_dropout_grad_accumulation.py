"""Dropout inside a checkpoint (its RNG state is replayed) and gradient accumulation: no side effect."""
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def main() -> None:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.GELU(), nn.Linear(8, 4))
    for _ in range(2):  # two micro-batches accumulate into .grad
        x = torch.randn(3, 4, requires_grad=True)
        checkpoint(block, x, use_reentrant=False).sum().backward()


main()
