"""A view created under no_grad, written in place with grad mode back on."""
import torch

x = torch.randn(2, 4, requires_grad=True)
h = x * 2
with torch.no_grad():
    row = h[0]
row.zero_()  # expect: IPD103
