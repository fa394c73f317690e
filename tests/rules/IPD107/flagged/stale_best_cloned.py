"""A snapshot taken of the "best" aliases only after the step: `.detach().clone()` of a stale alias."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(4, 8)).sum().backward()
best = model.state_dict()
opt.step()  # expect: IPD107
frozen = {k: v.detach().clone() for k, v in best.items()}  # expect-read: IPD107
