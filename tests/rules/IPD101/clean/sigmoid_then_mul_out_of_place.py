"""The fix from the rule doc: the write is out of place, sigmoid's saved output is intact."""
import torch

x = torch.randn(4, requires_grad=True)
s = torch.sigmoid(x)
s = s * 2
s.sum().backward()
