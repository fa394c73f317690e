"""`expand()` then `.clone()` before writing: every element has its own memory."""
import torch

x = torch.randn(1, 4, requires_grad=True)
y = (x * 2).expand(3, 4).clone()
y.add_(1)
y.sum().backward()
