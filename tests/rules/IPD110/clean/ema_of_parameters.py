"""An EMA / Polyak update of a target network under `no_grad` (timm's ModelEmaV2, DQN target nets):
writes into leaves, used by the next forward; the online network trains as usual."""
import torch
from torch import nn

torch.manual_seed(0)
online = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
target = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
target.load_state_dict(online.state_dict())
opt = torch.optim.SGD(online.parameters(), lr=0.1)
for _ in range(2):
    x = torch.randn(3, 4)
    with torch.no_grad():
        y = target(x)
    loss = (online(x) - y).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():
        for t, p in zip(target.parameters(), online.parameters()):
            t.mul_(0.99).add_(p, alpha=0.01)
            t.data.copy_(t.data)
