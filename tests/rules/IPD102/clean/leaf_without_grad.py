"""In-place writes to leaves that do not require grad (a buffer, a plain tensor) are fine."""
import torch
from torch import nn

torch.manual_seed(0)
bn = nn.BatchNorm1d(4)
with torch.no_grad():
    bn.running_mean.mul_(0.5)
x = torch.randn(3, 4)
x.clamp_(-1, 1)
bn(x).sum().backward()
