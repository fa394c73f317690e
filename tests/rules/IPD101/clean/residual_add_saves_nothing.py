"""`h += f(h)` where f saves nothing of h (a scalar multiple): nothing saved is overwritten."""
import torch
from torch import nn

torch.manual_seed(0)
fc = nn.Linear(8, 8)
h = fc(torch.randn(2, 8))
h += h * 2
h.sum().backward()
