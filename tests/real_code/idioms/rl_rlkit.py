"""Off-policy actor-critic trainers in the shape of rail-berkeley/rlkit.

Three trainers, each with the sequence of graphs, writes and optimizer steps of its rlkit
original (re-written here, tiny networks, a random replay batch):

- `SACTrainer`: rlkit/torch/sac/sac.py (the `compute_loss` + `train_from_torch` form): the
  target Q-values are built *with* grad through `policy(next_obs)` and `target_qf*`, then used
  only as `q_target.detach()`; alpha, policy, qf1 and qf2 steps, then the soft update through
  `target_param.data.copy_(...)` (rlkit's `ptu.soft_update_from_to`).
- `TD3Trainer`: rlkit/torch/td3/td3.py: `next_actions = target_policy(next_obs)` with grad, the
  target graph kept alive by locals (`target_q_values`) through both critic steps, the delayed
  policy step and the three `.data.copy_` soft updates.
- `DDPGTrainer`: rlkit/torch/ddpg/ddpg.py: policy loss first, `next_actions.detach()` whose
  result is thrown away (as in rlkit), `q_target.detach()`, policy step, critic step, soft update.

`SAC2019Trainer` is the single-function rlkit SAC of 2019, whose critic steps run before
`policy_loss.backward()` although the policy loss went through `qf1`/`qf2`: on PyTorch >= 1.5
backward raises "modified by an inplace operation" (the hazardous variant).

Run as a script (`python tests/real_code/idioms/rl_rlkit.py`) it trains SAC, TD3 and DDPG for 3 iterations.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Normal

OBS, ACT, HID, BATCH = 5, 2, 16, 8


class ConcatMlp(nn.Module):
    """rlkit's ConcatMlp: concatenate the inputs along dim 1, then an MLP."""

    def __init__(self, din: int, dout: int = 1):
        super().__init__()
        self.fc0 = nn.Linear(din, HID)
        self.fc1 = nn.Linear(HID, HID)
        self.last_fc = nn.Linear(HID, dout)

    def forward(self, *inputs):
        h = torch.cat(inputs, dim=1)
        h = F.relu(self.fc0(h))
        h = F.relu(self.fc1(h))
        return self.last_fc(h)


class TanhNormal:
    """A tanh-squashed diagonal Gaussian with rlkit's stable log-det correction."""

    def __init__(self, mean, std):
        self.normal = Normal(mean, std)

    def rsample_and_logprob(self):
        pre_tanh = self.normal.rsample()
        action = torch.tanh(pre_tanh)
        log_det = 2.0 * (math.log(2.0) - pre_tanh - F.softplus(-2.0 * pre_tanh))
        return action, (self.normal.log_prob(pre_tanh) - log_det).sum(dim=1)


class TanhGaussianPolicy(nn.Module):
    LOG_SIG_MIN, LOG_SIG_MAX = -20.0, 2.0

    def __init__(self):
        super().__init__()
        self.fc0 = nn.Linear(OBS, HID)
        self.fc1 = nn.Linear(HID, HID)
        self.last_fc = nn.Linear(HID, ACT)
        self.last_fc_log_std = nn.Linear(HID, ACT)

    def forward(self, obs):
        h = F.relu(self.fc1(F.relu(self.fc0(obs))))
        log_std = torch.clamp(self.last_fc_log_std(h), self.LOG_SIG_MIN, self.LOG_SIG_MAX)
        return TanhNormal(self.last_fc(h), log_std.exp())

    def sample_with_log_prob(self, obs):  # the 2019 call shape: policy(obs, reparameterize=True, return_log_prob=True)
        return self(obs).rsample_and_logprob()


class TanhMlpPolicy(nn.Module):
    """Deterministic policy of DDPG/TD3: tanh of an MLP."""

    def __init__(self):
        super().__init__()
        self.fc0 = nn.Linear(OBS, HID)
        self.fc1 = nn.Linear(HID, HID)
        self.last_fc = nn.Linear(HID, ACT)

    def forward(self, obs):
        return torch.tanh(self.last_fc(F.relu(self.fc1(F.relu(self.fc0(obs))))))


class TensorBag(nn.Module):
    """Lets `snapshot()` and `watch()` see loose tensors (SAC's log_alpha)."""

    def __init__(self, **tensors):
        super().__init__()
        for name, t in tensors.items():
            self.register_buffer(name, t)


def soft_update_from_to(source: nn.Module, target: nn.Module, tau: float) -> None:
    """rlkit.torch.pytorch_util.soft_update_from_to."""
    for target_param, param in zip(target.parameters(), source.parameters()):
        target_param.data.copy_(target_param.data * (1.0 - tau) + param.data * tau)


def copy_model_params_from_to(source: nn.Module, target: nn.Module) -> None:
    for target_param, param in zip(target.parameters(), source.parameters()):
        target_param.data.copy_(param.data)


def sample_batch() -> dict[str, torch.Tensor]:
    return {
        "rewards": torch.randn(BATCH, 1),
        "terminals": (torch.rand(BATCH, 1) < 0.2).float(),
        "observations": torch.randn(BATCH, OBS),
        "actions": torch.rand(BATCH, ACT) * 2 - 1,
        "next_observations": torch.randn(BATCH, OBS),
    }


# ---------------------------------------------------------------------------
# SAC (rlkit, compute_loss form)
# ---------------------------------------------------------------------------


class SACTrainer:
    def __init__(self, lr: float = 3e-3):
        self.policy = TanhGaussianPolicy()
        self.qf1, self.qf2 = ConcatMlp(OBS + ACT), ConcatMlp(OBS + ACT)
        self.target_qf1, self.target_qf2 = ConcatMlp(OBS + ACT), ConcatMlp(OBS + ACT)
        self.target_entropy = -float(ACT)
        self.log_alpha = torch.zeros(1, requires_grad=True)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=lr)
        self.policy_optimizer = torch.optim.Adam(self.policy.parameters(), lr=lr)
        self.qf1_optimizer = torch.optim.Adam(self.qf1.parameters(), lr=lr)
        self.qf2_optimizer = torch.optim.Adam(self.qf2.parameters(), lr=lr)
        self.qf_criterion = nn.MSELoss()
        self.discount, self.reward_scale = 0.99, 1.0
        self.soft_target_tau, self.target_update_period = 5e-3, 1
        self._n_train_steps_total = 0
        self.eval_statistics: dict[str, float] = {}

    @property
    def networks(self):
        return (self.policy, self.qf1, self.qf2, self.target_qf1, self.target_qf2, TensorBag(log_alpha=self.log_alpha))

    def compute_loss(self, batch):
        rewards, terminals = batch["rewards"], batch["terminals"]
        obs, actions, next_obs = batch["observations"], batch["actions"], batch["next_observations"]

        # policy and alpha loss
        dist = self.policy(obs)
        new_obs_actions, log_pi = dist.rsample_and_logprob()
        log_pi = log_pi.unsqueeze(-1)
        alpha_loss = -(self.log_alpha * (log_pi + self.target_entropy).detach()).mean()
        alpha = self.log_alpha.exp()
        q_new_actions = torch.min(self.qf1(obs, new_obs_actions), self.qf2(obs, new_obs_actions))
        policy_loss = (alpha * log_pi - q_new_actions).mean()

        # QF loss: the target is built with grad, then detached
        q1_pred = self.qf1(obs, actions)
        q2_pred = self.qf2(obs, actions)
        next_dist = self.policy(next_obs)
        new_next_actions, new_log_pi = next_dist.rsample_and_logprob()
        new_log_pi = new_log_pi.unsqueeze(-1)
        target_q_values = torch.min(
            self.target_qf1(next_obs, new_next_actions), self.target_qf2(next_obs, new_next_actions)
        ) - alpha * new_log_pi
        q_target = self.reward_scale * rewards + (1.0 - terminals) * self.discount * target_q_values
        qf1_loss = self.qf_criterion(q1_pred, q_target.detach())
        qf2_loss = self.qf_criterion(q2_pred, q_target.detach())

        stats = {
            "QF1 Loss": qf1_loss.item(),
            "Policy Loss": policy_loss.item(),
            "Q Targets": q_target.detach().mean().item(),
            "Alpha": alpha.item(),
        }
        return (policy_loss, qf1_loss, qf2_loss, alpha_loss), stats

    def train_from_torch(self, batch):
        (policy_loss, qf1_loss, qf2_loss, alpha_loss), stats = self.compute_loss(batch)
        self.alpha_optimizer.zero_grad()
        alpha_loss.backward()
        self.alpha_optimizer.step()

        self.policy_optimizer.zero_grad()
        policy_loss.backward()
        self.policy_optimizer.step()

        self.qf1_optimizer.zero_grad()
        qf1_loss.backward()
        self.qf1_optimizer.step()

        self.qf2_optimizer.zero_grad()
        qf2_loss.backward()
        self.qf2_optimizer.step()

        self._n_train_steps_total += 1
        if self._n_train_steps_total % self.target_update_period == 0:
            soft_update_from_to(self.qf1, self.target_qf1, self.soft_target_tau)
            soft_update_from_to(self.qf2, self.target_qf2, self.soft_target_tau)
        self.eval_statistics = stats


class SAC2019Trainer(SACTrainer):
    """rlkit's single-function SAC of 2019: critic steps before `policy_loss.backward()`."""

    def train_from_torch(self, batch):
        rewards, terminals = batch["rewards"], batch["terminals"]
        obs, actions, next_obs = batch["observations"], batch["actions"], batch["next_observations"]

        q1_pred = self.qf1(obs, actions)
        q2_pred = self.qf2(obs, actions)
        new_next_actions, _ = self.policy.sample_with_log_prob(next_obs)
        target_q_values = torch.min(self.target_qf1(next_obs, new_next_actions), self.target_qf2(next_obs, new_next_actions))
        q_target = self.reward_scale * rewards + (1.0 - terminals) * self.discount * target_q_values
        qf1_loss = self.qf_criterion(q1_pred, q_target.detach())
        qf2_loss = self.qf_criterion(q2_pred, q_target.detach())

        new_obs_actions, log_pi = self.policy.sample_with_log_prob(obs)
        log_pi = log_pi.unsqueeze(-1)
        alpha_loss = -(self.log_alpha * (log_pi + self.target_entropy).detach()).mean()
        self.alpha_optimizer.zero_grad()
        alpha_loss.backward()
        self.alpha_optimizer.step()
        alpha = self.log_alpha.exp()
        q_new_actions = torch.min(self.qf1(obs, new_obs_actions), self.qf2(obs, new_obs_actions))
        policy_loss = (alpha * log_pi - q_new_actions).mean()

        self.qf1_optimizer.zero_grad()
        qf1_loss.backward()
        self.qf1_optimizer.step()  # <<sac2019-qf1-step>>

        self.qf2_optimizer.zero_grad()
        qf2_loss.backward()
        self.qf2_optimizer.step()

        self.policy_optimizer.zero_grad()
        policy_loss.backward()  # raises: q_new_actions saved qf1's and qf2's old weights
        self.policy_optimizer.step()

        soft_update_from_to(self.qf1, self.target_qf1, self.soft_target_tau)
        soft_update_from_to(self.qf2, self.target_qf2, self.soft_target_tau)


# ---------------------------------------------------------------------------
# TD3 (rlkit)
# ---------------------------------------------------------------------------


class TD3Trainer:
    def __init__(self, lr: float = 3e-3):
        self.policy, self.target_policy = TanhMlpPolicy(), TanhMlpPolicy()
        self.qf1, self.qf2 = ConcatMlp(OBS + ACT), ConcatMlp(OBS + ACT)
        self.target_qf1, self.target_qf2 = ConcatMlp(OBS + ACT), ConcatMlp(OBS + ACT)
        self.target_policy_noise, self.target_policy_noise_clip = 0.2, 0.5
        self.discount, self.reward_scale, self.tau = 0.99, 1.0, 5e-3
        self.policy_and_target_update_period = 2
        self.qf1_optimizer = torch.optim.Adam(self.qf1.parameters(), lr=lr)
        self.qf2_optimizer = torch.optim.Adam(self.qf2.parameters(), lr=lr)
        self.policy_optimizer = torch.optim.Adam(self.policy.parameters(), lr=lr)
        self._n_train_steps_total = 0
        self.eval_statistics: dict[str, float] = {}

    @property
    def networks(self):
        return (self.policy, self.qf1, self.qf2, self.target_policy, self.target_qf1, self.target_qf2)

    def train_from_torch(self, batch):
        rewards, terminals = batch["rewards"], batch["terminals"]
        obs, actions, next_obs = batch["observations"], batch["actions"], batch["next_observations"]

        next_actions = self.target_policy(next_obs)  # with grad: target_policy's weights are leaves that require it
        noise = torch.randn(next_actions.shape) * self.target_policy_noise
        noise = torch.clamp(noise, -self.target_policy_noise_clip, self.target_policy_noise_clip)
        noisy_next_actions = next_actions + noise
        target_q1_values = self.target_qf1(next_obs, noisy_next_actions)
        target_q2_values = self.target_qf2(next_obs, noisy_next_actions)
        target_q_values = torch.min(target_q1_values, target_q2_values)
        q_target = self.reward_scale * rewards + (1.0 - terminals) * self.discount * target_q_values
        q_target = q_target.detach()

        q1_pred = self.qf1(obs, actions)
        bellman_errors_1 = (q1_pred - q_target) ** 2
        qf1_loss = bellman_errors_1.mean()
        q2_pred = self.qf2(obs, actions)
        bellman_errors_2 = (q2_pred - q_target) ** 2
        qf2_loss = bellman_errors_2.mean()

        self.qf1_optimizer.zero_grad()
        qf1_loss.backward()
        self.qf1_optimizer.step()
        self.qf2_optimizer.zero_grad()
        qf2_loss.backward()
        self.qf2_optimizer.step()

        policy_actions = policy_loss = None
        if self._n_train_steps_total % self.policy_and_target_update_period == 0:
            policy_actions = self.policy(obs)
            q_output = self.qf1(obs, policy_actions)
            policy_loss = -q_output.mean()
            self.policy_optimizer.zero_grad()
            policy_loss.backward()
            self.policy_optimizer.step()
            # target_q_values (alive) saved target_policy's and target_qf*'s weights
            soft_update_from_to(self.policy, self.target_policy, self.tau)
            soft_update_from_to(self.qf1, self.target_qf1, self.tau)
            soft_update_from_to(self.qf2, self.target_qf2, self.tau)

        if not self.eval_statistics:
            if policy_loss is None:
                policy_actions = self.policy(obs)
                policy_loss = -self.qf1(obs, policy_actions).mean()
            self.eval_statistics = {
                "QF1 Loss": qf1_loss.item(),
                "Policy Loss": policy_loss.item(),
                "Q Targets": q_target.mean().item(),
                "Bellman Errors 1": bellman_errors_1.mean().item(),
                "Policy Action": policy_actions.detach().abs().mean().item(),
            }
        self._n_train_steps_total += 1


# ---------------------------------------------------------------------------
# DDPG (rlkit)
# ---------------------------------------------------------------------------


class DDPGTrainer:
    def __init__(self, lr: float = 3e-3, use_soft_update: bool = True):
        self.policy, self.qf = TanhMlpPolicy(), ConcatMlp(OBS + ACT)
        self.target_policy, self.target_qf = TanhMlpPolicy(), ConcatMlp(OBS + ACT)
        copy_model_params_from_to(self.policy, self.target_policy)  # policy.copy()
        copy_model_params_from_to(self.qf, self.target_qf)
        self.discount, self.tau, self.use_soft_update = 0.99, 1e-2, use_soft_update
        self.target_hard_update_period = 2
        self.qf_criterion = nn.MSELoss()
        self.qf_optimizer = torch.optim.Adam(self.qf.parameters(), lr=lr)
        self.policy_optimizer = torch.optim.Adam(self.policy.parameters(), lr=lr / 10)
        self._n_train_steps_total = 0

    @property
    def networks(self):
        return (self.policy, self.qf, self.target_policy, self.target_qf)

    def train_from_torch(self, batch):
        rewards, terminals = batch["rewards"], batch["terminals"]
        obs, actions, next_obs = batch["observations"], batch["actions"], batch["next_observations"]

        policy_actions = self.policy(obs)
        q_output = self.qf(obs, policy_actions)
        raw_policy_loss = policy_loss = -q_output.mean()

        next_actions = self.target_policy(next_obs)
        next_actions.detach()  # a no-op in rlkit too: the result is discarded
        target_q_values = self.target_qf(next_obs, next_actions)
        q_target = rewards + (1.0 - terminals) * self.discount * target_q_values
        q_target = q_target.detach()
        q_target = torch.clamp(q_target, -100.0, 100.0)
        q_pred = self.qf(obs, actions)
        bellman_errors = (q_pred - q_target) ** 2
        qf_loss = self.qf_criterion(q_pred, q_target)

        self.policy_optimizer.zero_grad()
        policy_loss.backward()
        self.policy_optimizer.step()

        self.qf_optimizer.zero_grad()
        qf_loss.backward()
        self.qf_optimizer.step()

        self._n_train_steps_total += 1
        if self.use_soft_update:
            soft_update_from_to(self.policy, self.target_policy, self.tau)
            soft_update_from_to(self.qf, self.target_qf, self.tau)
        elif self._n_train_steps_total % self.target_hard_update_period == 0:
            copy_model_params_from_to(self.qf, self.target_qf)
            copy_model_params_from_to(self.policy, self.target_policy)
        self.stats = (raw_policy_loss.item(), bellman_errors.mean().item())


TRAINERS = {"sac": SACTrainer, "td3": TD3Trainer, "ddpg": DDPGTrainer, "ddpg_hard": lambda: DDPGTrainer(use_soft_update=False)}


def build(kind: str = "sac"):
    return TRAINERS[kind]()


def train(trainer, iterations: int = 3) -> None:
    for _ in range(iterations):
        trainer.train_from_torch(sample_batch())


def modules(trainer) -> tuple:
    return trainer.networks


def main() -> None:
    torch.set_num_threads(1)
    for kind in ("sac", "td3", "ddpg"):
        torch.manual_seed(0)
        trainer = build(kind)
        train(trainer)
        print(kind, "trained", trainer._n_train_steps_total, "iterations")


if __name__ == "__main__":
    main()
