"""In-place ReLU after the first Linear: it writes the model's own activation, not the caller's batch."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 2))
x = torch.randn(4, 8)
model(x).sum().backward()
