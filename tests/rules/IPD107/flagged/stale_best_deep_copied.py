"""The "best" dict deep-copied too late: `copy.deepcopy` copies the aliases after the step changed them."""
import copy

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
model(torch.randn(4, 8)).sum().backward()
best = model.state_dict()
opt.step()  # expect: IPD107
kept = copy.deepcopy(best)  # expect-read: IPD107
