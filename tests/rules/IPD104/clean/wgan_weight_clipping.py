"""WGAN's critic weight clipping through `.data`, after the step and before the next forward."""
import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    critic = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.RMSprop(critic.parameters(), lr=5e-5)
    for _ in range(2):
        opt.zero_grad()
        loss = -critic(torch.randn(5, 4)).mean() + critic(torch.randn(5, 4)).mean()
        loss.backward()
        opt.step()
        for p in critic.parameters():
            p.data.clamp_(-0.01, 0.01)


main()
