"""The reentrant checkpoint (the old default) over conv-BN-ReLU: BatchNorm's statistics update twice."""
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def main() -> None:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(inplace=True))
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    y = checkpoint(block, x, use_reentrant=True)
    y.sum().backward()  # expect: IPD108  (the recompute runs inside backward; Sequential is torch's code)


main()
