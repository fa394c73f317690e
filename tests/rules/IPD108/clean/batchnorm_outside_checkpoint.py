"""The fix: keep BatchNorm outside the checkpointed region."""
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def main() -> None:
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Tanh())
    bn = nn.BatchNorm2d(4)
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    y = bn(checkpoint(conv, x, use_reentrant=False))
    y.sum().backward()


main()
