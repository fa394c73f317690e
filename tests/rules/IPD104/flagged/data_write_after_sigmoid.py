"""The rule doc's example: `.data` shares the storage but not the version counter."""
import torch

x = torch.randn(4, requires_grad=True)
s = torch.sigmoid(x)  # expect-saved: IPD104
s.data.mul_(0.5)  # expect: IPD104
s.sum().backward()
