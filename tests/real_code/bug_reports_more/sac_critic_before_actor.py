"""rlkit's SACTrainer.train_from_torch: both Q-function steps before the policy's backward.

Source: https://github.com/rail-berkeley/rlkit/pull/109 ("Optimize actor before the critic: The
actor should be optimized first. Otherwise, the weights of the critic would have been changed when
back propagating the gradients for the actor. The latter will create an error in pytorch 1.5.0"),
rlkit/torch/sac/sac.py. `policy_loss` goes through `self.qf1(obs, new_obs_actions)`, whose Linear
layers saved their weights; `self.qf1_optimizer.step()` overwrites them before `policy_loss.backward()`.
The intended program is the PR's: the policy's zero_grad/backward/step block moved above the Q
functions'. (Networks cut to two layers, a Gaussian policy without tanh, fixed alpha, no target
networks' update.)
"""
import torch
from torch import nn

torch.manual_seed(0)


def mlp(inp, out):
    return nn.Sequential(nn.Linear(inp, 16), nn.ReLU(), nn.Linear(16, out))


class ConcatMlp(nn.Module):
    def __init__(self, inp, out):
        super().__init__()
        self.net = mlp(inp, out)

    def forward(self, *inputs):
        return self.net(torch.cat(inputs, dim=1))  # <saved>


class TanhGaussianPolicy(nn.Module):
    def __init__(self, obs_dim, action_dim):
        super().__init__()
        self.net = mlp(obs_dim, 2 * action_dim)

    def forward(self, obs):
        mean, log_std = self.net(obs).chunk(2, dim=-1)
        std = log_std.clamp(-5, 2).exp()
        action = mean + std * torch.randn_like(mean)
        log_prob = (-((action - mean) ** 2) / (2 * std ** 2) - std.log()).sum(dim=1, keepdim=True)
        return action, log_prob


class SACTrainer:
    def __init__(self, policy, qf1, qf2, target_qf1, target_qf2, discount=0.99, alpha=0.1):
        self.policy, self.qf1, self.qf2 = policy, qf1, qf2
        self.target_qf1, self.target_qf2 = target_qf1, target_qf2
        self.discount, self.alpha = discount, alpha
        self.qf_criterion = nn.MSELoss()
        self.policy_optimizer = torch.optim.Adam(self.policy.parameters(), lr=3e-4)
        self.qf1_optimizer = torch.optim.Adam(self.qf1.parameters(), lr=3e-4)
        self.qf2_optimizer = torch.optim.Adam(self.qf2.parameters(), lr=3e-4)

    def train_from_torch(self, batch):
        rewards, terminals, obs, actions, next_obs = (
            batch['rewards'], batch['terminals'], batch['observations'], batch['actions'], batch['next_observations']
        )
        """
        Policy and Alpha Loss
        """
        new_obs_actions, log_pi = self.policy(obs)
        q_new_actions = torch.min(
            self.qf1(obs, new_obs_actions),
            self.qf2(obs, new_obs_actions),  # <saved-call>
        )
        policy_loss = (self.alpha * log_pi - q_new_actions).mean()

        """
        QF Loss
        """
        q1_pred = self.qf1(obs, actions)
        q2_pred = self.qf2(obs, actions)
        new_next_actions, new_log_pi = self.policy(next_obs)
        target_q_values = torch.min(
            self.target_qf1(next_obs, new_next_actions),
            self.target_qf2(next_obs, new_next_actions),
        ) - self.alpha * new_log_pi
        q_target = rewards + (1. - terminals) * self.discount * target_q_values
        qf1_loss = self.qf_criterion(q1_pred, q_target.detach())
        qf2_loss = self.qf_criterion(q2_pred, q_target.detach())

        """
        Update networks
        """
        self.qf1_optimizer.zero_grad()
        qf1_loss.backward()
        self.qf1_optimizer.step()  # <write-qf1>

        self.qf2_optimizer.zero_grad()
        qf2_loss.backward()
        self.qf2_optimizer.step()  # <write-qf2>

        self.policy_optimizer.zero_grad()
        policy_loss.backward()  # <backward>
        self.policy_optimizer.step()


obs_dim, action_dim, n = 3, 2, 8
trainer = SACTrainer(
    TanhGaussianPolicy(obs_dim, action_dim),
    ConcatMlp(obs_dim + action_dim, 1),
    ConcatMlp(obs_dim + action_dim, 1),
    ConcatMlp(obs_dim + action_dim, 1),
    ConcatMlp(obs_dim + action_dim, 1),
)
batch = {
    'rewards': torch.randn(n, 1), 'terminals': torch.zeros(n, 1), 'observations': torch.randn(n, obs_dim),
    'actions': torch.randn(n, action_dim), 'next_observations': torch.randn(n, obs_dim),
}
trainer.train_from_torch(batch)
result = {
    f"{name}.{k}": p.detach().clone()
    for name in ("policy", "qf1", "qf2")
    for k, p in getattr(trainer, name).named_parameters()
}
