"""A view created under no_grad and written under no_grad too: PyTorch allows it."""
import torch

x = torch.randn(2, 4, requires_grad=True)
h = x * 2
with torch.no_grad():
    row = h[0]
    row.zero_()
