"""The views of `unbind`, used out of place (or after `.clone()`)."""
import torch

x = torch.randn(2, 4, requires_grad=True)
first, second = (x * 2).unbind(0)
first = first * 2
second = second.clone()
second.mul_(3)
(first + second).sum().backward()
