"""A NumPy in-place write into a tensor no op saved for backward (`x * 2` saves nothing).

Source: the near-miss of pytorch/pytorch#96852's case: writing memory PyTorch handed out is only
a hazard when autograd saved that memory for backward.
"""
import torch

x = torch.randn(8, requires_grad=True)
y = x * 2  # MulBackward0 saves the scalar, not y
a = y.detach().numpy()
a *= 0.5
y.sum().backward()
