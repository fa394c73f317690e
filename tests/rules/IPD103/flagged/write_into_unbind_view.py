"""Writing in place to one of the views `unbind` returned (a multi-output view)."""
import torch

x = torch.randn(2, 4, requires_grad=True)
first, second = (x * 2).unbind(0)
first.mul_(2)  # expect: IPD103
