"""The fix: `copy.deepcopy(model.state_dict())` is a real snapshot."""
import copy

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(4, 8)).sum().backward()
best = copy.deepcopy(model.state_dict())
opt.step()
model.load_state_dict(best)
