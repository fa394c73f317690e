"""gail-airl-ppo's StateDependentPolicy.sample: `log_stds.clamp_(-20, 2)` on a `chunk` output.

Source: https://github.com/toshikwa/gail-airl-ppo.pytorch/issues/13 ("Output 1 of SplitBackward0 is
a view and is being modified inplace ... `log_stds = self.net(states).chunk(2, dim=-1)` ...
When I change `clamp_` to `clamp`, the program can run normally"), network/policy.py:49.
"""
import torch
from torch import nn

torch.manual_seed(0)


def reparameterize(means, log_stds):
    noises = torch.randn_like(means)
    us = means + noises * log_stds.exp()
    actions = torch.tanh(us)
    return actions, us


class StateDependentPolicy(nn.Module):
    def __init__(self, state_dim=4, action_dim=2, hidden_units=16):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(state_dim, hidden_units),
            nn.Tanh(),
            nn.Linear(hidden_units, 2 * action_dim),
        )

    def sample(self, states):
        means, log_stds = self.net(states).chunk(2, dim=-1)  # <views>
        return reparameterize(means, log_stds.clamp_(-20, 2))  # <write>


actor = StateDependentPolicy()
actions, us = actor.sample(torch.randn(5, 4))
loss = actions.square().sum()
loss.backward()
result = {"loss": loss.detach(), **{n: p.grad for n, p in actor.named_parameters()}}
