"""Soft (Polyak) target-network updates, in every form public RL code writes them.

The training loop is the TD3 update of the author's code (sfujimoto/TD3, TD3.py `train`):
critic step, delayed actor step, then the soft update of both target networks. The target is
computed either under `torch.no_grad()` (as there) or, as rlkit's TD3/DDPG do, *with* grad
through `actor_target`/`critic_target` and `.detach()`ed at the end while the graph stays alive
in locals until the soft update has run (`target_mode="detach"`).

The update forms (`UPDATES`):
- "data_copy":   `tp.data.copy_(tau * p.data + (1 - tau) * tp.data)` (TD3.py, rlkit, CleanRL)
- "spinningup":  under no_grad, `p_targ.data.mul_(polyak); p_targ.data.add_((1 - polyak) * p.data)`
                 (openai/spinningup sac.py / td3.py)
- "sb3":         under no_grad, `tp.data.mul_(1 - tau); torch.add(tp.data, p.data, alpha=tau, out=tp.data)`
                 (stable-baselines3 `polyak_update`)
- "mul_add":     under no_grad, `tp.mul_(1 - tau).add_(p, alpha=tau)` (the same without `.data`)
- "lerp":        under no_grad, `tp.lerp_(p, tau)` (timm ModelEmaV3's per-tensor path)
- "foreach_lerp": `torch._foreach_lerp_(targets, params, tau)` (timm ModelEmaV3's foreach path)

Run as a script it trains 3 iterations with every form and both target modes.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

STATE, ACTION, HID, BATCH = 5, 2, 16, 8


def update_data_copy(net, target, tau):
    for param, target_param in zip(net.parameters(), target.parameters()):
        target_param.data.copy_(tau * param.data + (1 - tau) * target_param.data)


def update_spinningup(net, target, tau):
    polyak = 1 - tau
    with torch.no_grad():
        for p, p_targ in zip(net.parameters(), target.parameters()):
            p_targ.data.mul_(polyak)
            p_targ.data.add_((1 - polyak) * p.data)


def update_sb3(net, target, tau):
    with torch.no_grad():
        for param, target_param in zip(net.parameters(), target.parameters()):
            target_param.data.mul_(1 - tau)
            torch.add(target_param.data, param.data, alpha=tau, out=target_param.data)


def update_mul_add(net, target, tau):
    with torch.no_grad():
        for p, tp in zip(net.parameters(), target.parameters()):
            tp.mul_(1 - tau).add_(p, alpha=tau)


def update_lerp(net, target, tau):
    with torch.no_grad():
        for p, tp in zip(net.parameters(), target.parameters()):
            tp.lerp_(p, tau)


def update_foreach_lerp(net, target, tau):
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(net.parameters()), tau)


UPDATES = {
    "data_copy": update_data_copy,
    "spinningup": update_spinningup,
    "sb3": update_sb3,
    "mul_add": update_mul_add,
    "lerp": update_lerp,
    "foreach_lerp": update_foreach_lerp,
}


class Actor(nn.Module):
    def __init__(self, max_action: float = 1.0):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(STATE, HID), nn.Linear(HID, HID), nn.Linear(HID, ACTION)
        self.max_action = max_action

    def forward(self, state):
        a = F.relu(self.l1(state))
        a = F.relu(self.l2(a))
        return self.max_action * torch.tanh(self.l3(a))


class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(STATE + ACTION, HID), nn.Linear(HID, HID), nn.Linear(HID, 1)
        self.l4, self.l5, self.l6 = nn.Linear(STATE + ACTION, HID), nn.Linear(HID, HID), nn.Linear(HID, 1)

    def forward(self, state, action):
        sa = torch.cat([state, action], 1)
        q1 = self.l3(F.relu(self.l2(F.relu(self.l1(sa)))))
        q2 = self.l6(F.relu(self.l5(F.relu(self.l4(sa)))))
        return q1, q2

    def Q1(self, state, action):
        sa = torch.cat([state, action], 1)
        return self.l3(F.relu(self.l2(F.relu(self.l1(sa)))))


class TD3:
    def __init__(self, update: str = "data_copy", target_mode: str = "no_grad"):
        self.actor = Actor()
        self.actor_target = copy.deepcopy(self.actor)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=3e-3)
        self.critic = Critic()
        self.critic_target = copy.deepcopy(self.critic)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=3e-3)
        self.max_action, self.discount, self.tau = 1.0, 0.99, 0.05
        self.policy_noise, self.noise_clip, self.policy_freq = 0.2, 0.5, 2
        self.total_it = 0
        self.soft_update = UPDATES[update]
        self.target_mode = target_mode

    @property
    def networks(self):
        return (self.actor, self.critic, self.actor_target, self.critic_target)

    def _target(self, next_state, action, reward, not_done):
        noise = (torch.randn_like(action) * self.policy_noise).clamp(-self.noise_clip, self.noise_clip)
        next_action = (self.actor_target(next_state) + noise).clamp(-self.max_action, self.max_action)
        target_q1, target_q2 = self.critic_target(next_state, next_action)
        target_q = torch.min(target_q1, target_q2)
        return next_action, reward + not_done * self.discount * target_q

    def train(self, batch):
        self.total_it += 1
        state, action, next_state, reward, not_done = batch
        if self.target_mode == "no_grad":
            with torch.no_grad():
                _, target_q = self._target(next_state, action, reward, not_done)
        else:  # with grad, detached; next_action and the graph behind it stay alive in locals
            next_action, target_q_graph = self._target(next_state, action, reward, not_done)
            target_q = target_q_graph.detach()

        current_q1, current_q2 = self.critic(state, action)
        critic_loss = F.mse_loss(current_q1, target_q) + F.mse_loss(current_q2, target_q)
        self.critic_optimizer.zero_grad()
        critic_loss.backward()
        self.critic_optimizer.step()

        if self.total_it % self.policy_freq == 0:
            actor_loss = -self.critic.Q1(state, self.actor(state)).mean()
            self.actor_optimizer.zero_grad()
            actor_loss.backward()
            self.actor_optimizer.step()
            self.soft_update(self.critic, self.critic_target, self.tau)
            self.soft_update(self.actor, self.actor_target, self.tau)


def sample_batch():
    return (
        torch.randn(BATCH, STATE),
        torch.rand(BATCH, ACTION) * 2 - 1,
        torch.randn(BATCH, STATE),
        torch.randn(BATCH, 1),
        (torch.rand(BATCH, 1) > 0.1).float(),
    )


def build(update: str = "data_copy", target_mode: str = "no_grad") -> TD3:
    return TD3(update, target_mode)


def train(agent: TD3, iterations: int = 4) -> None:
    for _ in range(iterations):
        agent.train(sample_batch())


def modules(agent: TD3) -> tuple:
    return agent.networks


def main() -> None:
    torch.set_num_threads(1)
    for target_mode in ("no_grad", "detach"):
        for update in UPDATES:
            torch.manual_seed(0)
            agent = build(update, target_mode)
            train(agent)
            print(update, target_mode, "ok")


if __name__ == "__main__":
    main()
