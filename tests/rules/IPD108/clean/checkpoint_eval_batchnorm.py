"""BatchNorm in eval mode inside a checkpoint: no running statistics change, nothing is repeated."""
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

torch.manual_seed(0)
block = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
block[1].eval()
x = torch.randn(2, 3, 6, 6, requires_grad=True)
checkpoint(block, x, use_reentrant=False).sum().backward()
