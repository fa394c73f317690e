"""The fix from the rule doc: rescale out of place, autograd sees it."""
import torch

x = torch.randn(4, requires_grad=True)
s = torch.sigmoid(x)
s = s.mul(0.5)
s.sum().backward()
