"""The "best" weights loaded into a fresh model for evaluation: `copy_` copies the stepped values."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(4, 8)).sum().backward()
best = model.state_dict()
opt.step()  # expect: IPD107
evaluator = nn.Linear(8, 2)
evaluator.load_state_dict(best)  # expect-read: IPD107
