"""PPO as CleanRL writes it (vwxyzjn/cleanrl, cleanrl/ppo.py), with a fake vector environment.

The rollout storage `obs`, `actions`, `logprobs`, `rewards`, `dones`, `values` is allocated once
and filled in place step by step (`obs[step] = next_obs`, `values[step] = value.flatten()` under
no_grad, `actions[step] = action` outside it); GAE fills `advantages[t] = lastgaelam = ...`
under no_grad; the flattened views `b_obs = obs.reshape(...)` are then trained on for
`update_epochs` epochs of shuffled minibatches: clipped surrogate, clipped value loss, entropy
bonus, `nn.utils.clip_grad_norm_`, Adam(eps=1e-5) with the learning rate annealed through
`optimizer.param_groups[0]["lr"]`, early stop on `approx_kl > target_kl`. The next rollout
overwrites the same buffers the previous update's views alias.

`FakeEnvs` stands for `gym.vector.SyncVectorEnv` of CartPole: float32 NumPy observations,
rewards and dones, from a seeded NumPy generator. Run as a script it trains 2 updates.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.distributions.categorical import Categorical


class Args:
    learning_rate = 2.5e-4
    num_envs = 2
    num_steps = 8
    anneal_lr = True
    gamma = 0.99
    gae_lambda = 0.95
    num_minibatches = 2
    update_epochs = 2
    norm_adv = True
    clip_coef = 0.2
    clip_vloss = True
    ent_coef = 0.01
    vf_coef = 0.5
    max_grad_norm = 0.5
    target_kl = None
    batch_size = num_envs * num_steps
    minibatch_size = batch_size // num_minibatches
    total_timesteps = 2 * batch_size


class FakeEnvs:
    """CartPole-shaped: 4 float32 observations, 2 discrete actions."""

    class single_observation_space:
        shape = (4,)

    class single_action_space:
        n = 2
        shape = ()

    def __init__(self, num_envs: int, seed: int = 0):
        self.num_envs = num_envs
        self.rng = np.random.default_rng(seed)

    def reset(self):
        return self.rng.standard_normal((self.num_envs, 4)).astype(np.float32)

    def step(self, action):
        assert action.shape == (self.num_envs,)
        obs = self.rng.standard_normal((self.num_envs, 4)).astype(np.float32)
        reward = np.ones(self.num_envs, dtype=np.float32)
        done = self.rng.random(self.num_envs) < 0.2
        return obs, reward, done, [{} for _ in range(self.num_envs)]


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, envs):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(np.array(envs.single_observation_space.shape).prod(), 16)),
            nn.Tanh(),
            layer_init(nn.Linear(16, 16)),
            nn.Tanh(),
            layer_init(nn.Linear(16, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(np.array(envs.single_observation_space.shape).prod(), 16)),
            nn.Tanh(),
            layer_init(nn.Linear(16, 16)),
            nn.Tanh(),
            layer_init(nn.Linear(16, envs.single_action_space.n), std=0.01),
        )

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(self, x: torch.Tensor, action: Optional[torch.Tensor] = None):
        logits = self.actor(x)
        probs = Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def build(seed: int = 0):
    envs = FakeEnvs(Args.num_envs, seed)
    agent = Agent(envs)
    optimizer = optim.Adam(agent.parameters(), lr=Args.learning_rate, eps=1e-5)
    return {"agent": agent, "optimizer": optimizer, "envs": envs, "np_rng": np.random.default_rng(seed), "losses": []}


def train(objs):
    args, agent, optimizer, envs = Args, objs["agent"], objs["optimizer"], objs["envs"]
    device = torch.device("cpu")
    obs_space_shape = envs.single_observation_space.shape
    action_space_shape = envs.single_action_space.shape

    # ALGO Logic: Storage setup
    obs = torch.zeros((args.num_steps, args.num_envs) + obs_space_shape).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs) + action_space_shape).to(device)
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
    dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)

    global_step = 0
    next_obs = torch.Tensor(envs.reset()).to(device)
    next_done = torch.zeros(args.num_envs).to(device)
    num_updates = args.total_timesteps // args.batch_size

    for update in range(1, num_updates + 1):
        if args.anneal_lr:
            frac = 1.0 - (update - 1.0) / num_updates
            lrnow = frac * args.learning_rate
            optimizer.param_groups[0]["lr"] = lrnow

        for step in range(0, args.num_steps):
            global_step += 1 * args.num_envs
            obs[step] = next_obs
            dones[step] = next_done

            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob

            next_obs, reward, done, info = envs.step(action.cpu().numpy())
            rewards[step] = torch.tensor(reward).to(device).view(-1)
            next_obs, next_done = torch.Tensor(next_obs).to(device), torch.Tensor(done).to(device)

        # bootstrap value if not done
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards).to(device)
            lastgaelam = 0
            for t in reversed(range(args.num_steps)):
                if t == args.num_steps - 1:
                    nextnonterminal = 1.0 - next_done
                    nextvalues = next_value
                else:
                    nextnonterminal = 1.0 - dones[t + 1]
                    nextvalues = values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values

        # flatten the batch
        b_obs = obs.reshape((-1,) + obs_space_shape)
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape((-1,) + action_space_shape)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        # Optimizing the policy and value network
        b_inds = np.arange(args.batch_size)
        clipfracs = []
        for epoch in range(args.update_epochs):
            objs["np_rng"].shuffle(b_inds)  # np.random.shuffle(b_inds) in ppo.py
            for start in range(0, args.batch_size, args.minibatch_size):
                end = start + args.minibatch_size
                mb_inds = b_inds[start:end]

                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions.long()[mb_inds])
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()

                with torch.no_grad():
                    old_approx_kl = (-logratio).mean()
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs += [((ratio - 1.0).abs() > args.clip_coef).float().mean().item()]

                mb_advantages = b_advantages[mb_inds]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                # Policy loss
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                # Value loss
                newvalue = newvalue.view(-1)
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(
                        newvalue - b_values[mb_inds],
                        -args.clip_coef,
                        args.clip_coef,
                    )
                    v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                    v_loss_max = torch.max(v_loss_unclipped, v_loss_clipped)
                    v_loss = 0.5 * v_loss_max.mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
                objs["losses"].append(loss.detach().clone())

            if args.target_kl is not None:
                if approx_kl > args.target_kl:
                    break
        objs["losses"].extend([old_approx_kl.clone(), torch.tensor(np.mean(clipfracs))])
    objs["buffers"] = (obs.clone(), actions.clone(), logprobs.clone(), rewards.clone(), values.clone(), advantages.clone())
    return objs["losses"]


def modules(objs) -> tuple:
    return (objs["agent"],)


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    train(build())
    print("ppo ok")


if __name__ == "__main__":
    main()
