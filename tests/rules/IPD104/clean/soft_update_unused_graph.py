"""A soft target-network update through `.data` while a graph that no backward reads is alive."""
import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    critic = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    target = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    obs = torch.randn(3, 4)
    q_next = target(obs)  # built with grad, only used detached
    q = critic(obs)
    loss = (q - q_next.detach()).pow(2).mean()
    loss.backward()
    for t, c in zip(target.parameters(), critic.parameters()):
        t.data.mul_(0.995).add_(c.data, alpha=0.005)
    del q_next


main()
