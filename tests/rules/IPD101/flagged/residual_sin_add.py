"""`h += sin(h)`: sin saved h for its backward, the augmented assignment overwrites it."""
import torch
from torch import nn

torch.manual_seed(0)
fc = nn.Linear(8, 8)
h = fc(torch.randn(2, 8))
h += torch.sin(h)  # expect: IPD101  expect-saved: IPD101
h.sum().backward()
