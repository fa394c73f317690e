"""BatchNorm's running statistics in training mode: backward never reads them."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1))
for _ in range(2):
    model(torch.randn(5, 4)).sum().backward()
