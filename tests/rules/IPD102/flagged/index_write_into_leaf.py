"""Masking an input one wants gradients for, through an index write (a view of the leaf)."""
import torch

x = torch.randn(4, 6, requires_grad=True)
x[:, 0] = 0.0  # expect: IPD102
