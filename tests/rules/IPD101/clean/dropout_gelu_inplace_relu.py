"""The rule doc's safe look-alikes: relu_ after Dropout and after GELU (neither saves its output)."""
import torch
from torch import nn

torch.manual_seed(0)
x = torch.randn(4, 8, requires_grad=True)
h = nn.functional.dropout(x * 2, p=0.5, training=True)
h.relu_()
g = nn.functional.gelu(h * 3)
g.relu_()
g.sum().backward()
