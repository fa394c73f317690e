"""An in-place ReLU, then `nn.Dropout(p=0, inplace=True)`, which writes nothing and returns what
it was handed: the ReLU's result, read by the loss, is the value the out-of-place program reads
(the object the ReLU overwrote is not read again)."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Dropout(0.0, inplace=True), nn.Linear(8, 2))
model(torch.randn(4, 8)).sum().backward()
