"""ReLU(inplace=True) after Linear and BatchNorm is safe: neither needs its output for backward."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(inplace=True), nn.Linear(8, 2))
model(torch.randn(4, 8)).sum().backward()
