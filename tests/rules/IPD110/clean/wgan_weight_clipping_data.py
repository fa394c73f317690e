"""WGAN's weight clipping (Arjovsky et al.'s reference code: `p.data.clamp_(-c, c)` after each critic
step): a write through `.data` into a leaf, the parameter itself; the next forward uses the new value."""
import torch
from torch import nn

torch.manual_seed(0)
critic = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.RMSprop(critic.parameters(), lr=5e-5)
for _ in range(2):
    loss = -critic(torch.randn(3, 4)).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    for p in critic.parameters():
        p.data.clamp_(-0.01, 0.01)
