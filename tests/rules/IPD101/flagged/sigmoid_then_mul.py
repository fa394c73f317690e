"""The rule doc's example: sigmoid saves its output, mul_ overwrites it; backward raises."""
import torch

x = torch.randn(4, requires_grad=True)
s = torch.sigmoid(x)  # expect-saved: IPD101
s.mul_(2)  # expect: IPD101
s.sum().backward()
