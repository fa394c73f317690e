"""`best = model.state_dict()` kept while training goes on, then written to disk: `torch.save` reads
the aliases' storages (no op) and saves the latest weights as the "best" ones."""
import io

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
best = None
for epoch in range(3):
    opt.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()  # expect: IPD107
    if epoch == 0:
        best = model.state_dict()
torch.save({"epoch": 0, "model": best}, io.BytesIO())  # expect-read: IPD107
