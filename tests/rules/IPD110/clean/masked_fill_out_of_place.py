"""The fix itself: `h = h.masked_fill(mask, 0)` records the mask in the graph (no gradient to the
masked entries)."""
import torch
from torch import nn

torch.manual_seed(0)
fc, head = nn.Linear(8, 8), nn.Linear(8, 1)
h = fc(torch.randn(4, 8))
h = h.masked_fill(h < 0, 0)
head(h).sum().backward()
