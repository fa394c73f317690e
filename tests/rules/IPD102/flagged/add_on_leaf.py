"""The rule doc's example: a leaf that requires grad, modified in place with grad mode on."""
import torch

w = torch.randn(3, requires_grad=True)
w.add_(1)  # expect: IPD102
