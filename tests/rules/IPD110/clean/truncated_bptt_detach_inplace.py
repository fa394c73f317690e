"""Truncated BPTT (pytorch/examples' word_language_model repackages the hidden state): `hidden.detach_()`
between chunks changes metadata only, and the reset under no_grad writes a tensor that no longer has
history."""
import torch
from torch import nn

torch.manual_seed(0)
rnn, head = nn.GRU(4, 8), nn.Linear(8, 1)
opt = torch.optim.SGD([*rnn.parameters(), *head.parameters()], lr=0.1)
hidden = torch.zeros(1, 2, 8)
for step in range(3):
    out, hidden = rnn(torch.randn(5, 2, 4), hidden)
    loss = head(out).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    hidden.detach_()
    if step == 1:
        with torch.no_grad():
            hidden.zero_()
