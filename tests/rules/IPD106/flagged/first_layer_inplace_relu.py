"""The rule doc's example: the first layer is an in-place ReLU, and the caller reads its batch again."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.ReLU(inplace=True), nn.Linear(8, 2))
x = torch.randn(4, 8)
model(x)  # expect: IPD106
scale = x.abs().mean()  # expect-read: IPD106
