"""The rule doc's example: `best = model.state_dict()` aliases the live weights; the restore restores nothing."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(4, 8)).sum().backward()
best = model.state_dict()
opt.step()  # expect: IPD107
model.load_state_dict(best)  # expect-read: IPD107
