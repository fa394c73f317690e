"""A statistic zeroed through `.detach()` for logging after the loss was computed: no op with grad on
uses the changed tensor in a graph that is backpropagated (`.item()` records no history)."""
import torch
from torch import nn

torch.manual_seed(0)
fc, head = nn.Linear(8, 8), nn.Linear(8, 1)
h = fc(torch.randn(4, 8))
loss = head(torch.relu(h) * 2).sum()
stats = h.detach()
stats[stats < 0] = 0
print("active mean", h.mean().item(), "max", stats.max().item())
loss.backward()
