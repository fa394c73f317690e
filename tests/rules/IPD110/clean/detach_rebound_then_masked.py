"""`h = h.detach()` first, then the write: the name now holds a tensor with no history, and what the head
uses carries no gradient into fc by design (the dependency is cut explicitly)."""
import torch
from torch import nn

torch.manual_seed(0)
fc, head = nn.Linear(8, 8), nn.Linear(8, 1)
h = fc(torch.randn(4, 8))
h = h.detach()
h[h < 0] = 0
head(h).sum().backward()
