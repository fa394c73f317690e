"""Correct training idioms from well-known public code stay silent under `watch()`.

Each idiom is written in the shape of the code named in its test's docstring: the same sequence of
graphs, in-place writes and optimizer steps (tiny models, 2-4 iterations). "Silent" means what it
means in test_idioms.py: no finding of severity error or warning (info is allowed), no exception,
and parameters, buffers and gradients bit-identical to the same code run without watch() from the
same seeds (`twin`).

Where an idiom has a genuinely hazardous variant (a write that backward really reads), the variant
is here too: its behaviour in plain PyTorch is checked first (it raises, or it silently changes
gradients), then the finding the tool must make (IPD101 when PyTorch raises; IPD104 for a `.data`
write that backward then reads).

A handful of idioms live in tests/real_code/idioms/*.py and also run as scripts under `inplace-doctor run`.
"""

from __future__ import annotations

import copy
import itertools
import math
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_idioms import (
    assert_clean,
    has_error,
    load_program,
    one_thread,  # noqa: F401  (its autouse fixture, for these tests too)
    twin,
)
from torch import nn

import inplace_doctor as ipd

HERE = Path(__file__).resolve()
IDIOMS = HERE.parent / "idioms"
REPO = HERE.parents[2]


def load(name: str) -> ModuleType:
    """Import tests/real_code/idioms/<name>.py (plain files, no package)."""
    return load_program(IDIOMS, name)


def describe(findings) -> str:
    return "\n\n".join(f"{f.code} {f.severity}: {f.message}" for f in findings)


# ---------------------------------------------------------------------------
# 1. RL: target networks built with grad, used detached (rlkit SAC / TD3 / DDPG)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sac", "td3", "ddpg", "ddpg_hard"])
def test_rlkit_actor_critic_with_target_graphs_built_with_grad_is_clean(kind):
    """Modelled on rlkit: rlkit/torch/sac/sac.py SACTrainer.compute_loss + train_from_torch,
    rlkit/torch/td3/td3.py TD3Trainer.train_from_torch, rlkit/torch/ddpg/ddpg.py DDPG._do_training
    (soft updates through `ptu.soft_update_from_to`, or the hard copy every N steps).

    The targets go through `policy(next_obs)` / `target_policy(next_obs)` and the target Q networks
    with grad, are used only as `q_target.detach()`, and (TD3) the graph stays alive in locals while
    the critic steps, the policy step and the `.data.copy_` soft updates overwrite the weights it
    saved. Backward never reaches that graph: nothing to report. 3 iterations, 4 optimizers (SAC)."""
    rl = load("rl_rlkit")
    twin(lambda: rl.build(kind), rl.train, rl.modules)


def test_rlkit_sac_2019_order_critic_steps_before_policy_backward_is_flagged():
    """Hazard, modelled on rlkit's single-function SACTrainer.train_from_torch of 2019: the Q
    optimizers step before `policy_loss.backward()`, but the policy loss went through
    `qf1(obs, new_obs_actions)`, whose Linear layers saved the old weights (needed for the gradient
    w.r.t. the actions). Plain PyTorch >= 1.5 raises "modified by an inplace operation" (checked
    here): IPD101 naming the `qf1_optimizer.step()` line."""
    rl = load("rl_rlkit")
    torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        rl.SAC2019Trainer().train_from_torch(rl.sample_batch())
    torch.manual_seed(0)
    trainer = rl.SAC2019Trainer()
    with pytest.raises(ipd.InplaceError), ipd.watch(*trainer.networks) as session:
        trainer.train_from_torch(rl.sample_batch())
    assert has_error(session.findings, "IPD101"), describe(session.findings)
    src = (IDIOMS / "rl_rlkit.py").read_text().splitlines()
    step_line = next(i for i, line in enumerate(src, 1) if line.rstrip().endswith("# <<sac2019-qf1-step>>"))
    hits = [f for f in session.findings if f.code == "IPD101" and f.mutation.line == step_line]
    assert hits, describe(session.findings)


class DQN(nn.Module):
    def __init__(self, n_observations: int = 4, n_actions: int = 2):
        super().__init__()
        self.layer1, self.layer2, self.layer3 = nn.Linear(n_observations, 16), nn.Linear(16, 16), nn.Linear(16, n_actions)

    def forward(self, x):
        return self.layer3(F.relu(self.layer2(F.relu(self.layer1(x)))))


def dqn_optimize_model(version: str, policy_net: nn.Module, target_net: nn.Module, optimizer: torch.optim.Optimizer):
    """The DQN tutorial's `optimize_model` on a random batch, as `version` (2019 or 2023) writes it
    (`test_dqn_tutorial_target_network_is_clean`)."""
    BATCH_SIZE, GAMMA = 8, 0.99
    state_batch = torch.randn(BATCH_SIZE, 4)
    action_batch = torch.randint(0, 2, (BATCH_SIZE, 1))
    reward_batch = torch.randn(BATCH_SIZE)
    non_final_mask = torch.rand(BATCH_SIZE) > 0.25
    non_final_next_states = torch.randn(int(non_final_mask.sum()), 4)
    state_action_values = policy_net(state_batch).gather(1, action_batch)
    next_state_values = torch.zeros(BATCH_SIZE)
    if version == "2019":
        next_state_values[non_final_mask] = target_net(non_final_next_states).max(1)[0].detach()
    else:
        with torch.no_grad():
            next_state_values[non_final_mask] = target_net(non_final_next_states).max(1).values
    expected_state_action_values = (next_state_values * GAMMA) + reward_batch
    loss = F.smooth_l1_loss(state_action_values, expected_state_action_values.unsqueeze(1))
    optimizer.zero_grad()
    loss.backward()
    if version == "2019":
        for param in policy_net.parameters():
            param.grad.data.clamp_(-1, 1)
    else:
        torch.nn.utils.clip_grad_value_(policy_net.parameters(), 100)
    optimizer.step()


@pytest.mark.parametrize("version", ["2019", "2023"])
def test_dqn_tutorial_target_network_is_clean(version):
    """Modelled on the PyTorch DQN tutorial (reinforcement_q_learning.py), `optimize_model` and
    the episode loop. 2019: `next_state_values[non_final_mask] = target_net(...).max(1)[0].detach()`
    (target computed with grad, then detached), `param.grad.data.clamp_(-1, 1)` before RMSprop's
    step, `target_net.load_state_dict(policy_net.state_dict())` every TARGET_UPDATE episodes.
    2023: target under no_grad, `clip_grad_value_`, AdamW(amsgrad=True), and the soft update
    `target_sd[key] = policy_sd[key]*TAU + target_sd[key]*(1-TAU)` then `load_state_dict`."""
    TAU = 0.05

    def build():
        policy_net, target_net = DQN(), DQN()
        target_net.load_state_dict(policy_net.state_dict())
        if version == "2019":
            target_net.eval()
            optimizer = torch.optim.RMSprop(policy_net.parameters())
        else:
            optimizer = torch.optim.AdamW(policy_net.parameters(), lr=1e-3, amsgrad=True)
        return policy_net, target_net, optimizer

    def train(objs):
        policy_net, target_net, optimizer = objs
        for i_episode in range(2):
            for _ in range(2):  # steps of the episode
                with torch.no_grad():  # select_action
                    policy_net(torch.randn(1, 4)).max(1)[1].view(1, 1)
                dqn_optimize_model(version, policy_net, target_net, optimizer)
                if version == "2023":
                    target_net_state_dict = target_net.state_dict()
                    policy_net_state_dict = policy_net.state_dict()
                    for key in policy_net_state_dict:
                        target_net_state_dict[key] = policy_net_state_dict[key] * TAU + target_net_state_dict[key] * (1 - TAU)
                    target_net.load_state_dict(target_net_state_dict)
            if version == "2019" and i_episode % 1 == 0:  # TARGET_UPDATE
                target_net.load_state_dict(policy_net.state_dict())

    twin(build, train, lambda objs: objs[:2])


# ---------------------------------------------------------------------------
# 2. soft (Polyak) target updates
# ---------------------------------------------------------------------------

POLYAK_UPDATES = ["data_copy", "spinningup", "sb3", "mul_add", "lerp", "foreach_lerp"]


@pytest.mark.parametrize("target_mode", ["no_grad", "detach"])
@pytest.mark.parametrize("update", POLYAK_UPDATES)
def test_soft_target_update_after_the_steps_is_clean(update, target_mode):
    """Modelled on sfujimoto/TD3 TD3.py `train` (critic step, delayed actor step, soft update),
    with the update written as TD3.py / rlkit / CleanRL (`tp.data.copy_(tau*p.data + (1-tau)*tp.data)`),
    openai/spinningup (`p_targ.data.mul_(polyak); p_targ.data.add_(...)` under no_grad),
    stable-baselines3 `polyak_update` (`mul_` then `torch.add(..., out=tp.data)`), the `.data`-free
    `tp.mul_(1-tau).add_(p, alpha=tau)`, timm ModelEmaV3's `lerp_` and `torch._foreach_lerp_`.
    target_mode "detach": the target computed with grad through the target nets and detached (as
    rlkit does), its graph alive in locals while the soft update writes the weights it saved."""
    polyak = load("polyak")
    twin(lambda: polyak.build(update, target_mode), polyak.train, polyak.modules)


def _soft_update_before_backward(update: str, *, before: bool):
    """ikostrikov/pytorch-ddpg-naf ddpg.py `update_parameters` (target computed with grad through
    actor_target and critic_target, *not* detached), with the soft update of the critic target moved
    up between the target's forward and `value_loss.backward()`."""
    polyak = load("polyak")
    torch.manual_seed(0)
    actor, critic = polyak.Actor(), polyak.Critic()
    actor_target, critic_target = copy.deepcopy(actor), copy.deepcopy(critic)
    critic_optim = torch.optim.Adam(critic.parameters(), lr=1e-2)
    with torch.no_grad():  # the online critic has moved away from its target (earlier training)
        for p in critic.parameters():
            p.add_(0.1)
    state, action, next_state, reward, mask = polyak.sample_batch()
    next_action = actor_target(next_state)
    next_q, _ = critic_target(next_state, next_action)
    expected = reward + 0.99 * mask * next_q
    if before:
        polyak.UPDATES[update](critic, critic_target, 0.5)  # HAZARD: backward below reads critic_target
    critic_optim.zero_grad()
    q, _ = critic(state, action)
    value_loss = F.mse_loss(q, expected)
    value_loss.backward()
    critic_optim.step()
    if not before:
        polyak.UPDATES[update](critic, critic_target, 0.5)
    return (actor, critic, actor_target, critic_target), [p.grad.clone() for p in actor_target.parameters()]


@pytest.mark.parametrize(
    "update,code",
    [("data_copy", "IPD104"), ("spinningup", "IPD104"), ("sb3", "IPD104"), ("mul_add", "IPD101"), ("lerp", "IPD101"), ("foreach_lerp", "IPD101")],
)
def test_soft_update_before_the_backward_that_reads_the_target_is_flagged(update, code):
    """Hazard: a soft update between the forward through the target networks (with grad, not
    detached: ikostrikov/pytorch-ddpg-naf) and the backward of that loss. Backward needs
    critic_target's weights for the gradient reaching actor_target. Checked in plain PyTorch:
    through `.data` (data_copy, spinningup, sb3) it does not raise but gives actor_target different
    gradients than the update-after-backward order (silent: IPD104); without `.data` (mul_add,
    lerp_, _foreach_lerp_) the version counter moves and backward raises (IPD101)."""
    if code == "IPD104":
        _, grads_bad = _soft_update_before_backward(update, before=True)
        _, grads_ok = _soft_update_before_backward(update, before=False)
        assert not all(torch.equal(a, b) for a, b in zip(grads_bad, grads_ok))  # silently wrong
        with ipd.watch() as session:
            _soft_update_before_backward(update, before=True)
        assert has_error(session.findings, "IPD104"), describe(session.findings)
    else:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            _soft_update_before_backward(update, before=True)
        with pytest.raises(ipd.InplaceError), ipd.watch() as session:
            _soft_update_before_backward(update, before=True)
        assert has_error(session.findings, "IPD101"), describe(session.findings)


# ---------------------------------------------------------------------------
# 3. EMA of the weights: timm ModelEmaV2/V3, torch.optim.swa_utils
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_timm_style_model_ema_over_state_dict_values_is_clean(version):
    """Modelled on timm ModelEmaV2 (`ema_v.copy_(decay*e + (1-decay)*m)` over
    `ema.module.state_dict().values()` zipped with the model's, integer buffers included) and
    ModelEmaV3 (warm-up decay; `torch._foreach_lerp_` over the EMA's own floating state_dict values,
    `copy_` for the integer ones), driven by timm train.py `train_one_epoch` (step, then
    `model_ema.update(model, step=num_updates)`, EMA validated under no_grad)."""
    ema = load("ema_timm")
    twin(lambda: ema.build(version), ema.train, ema.modules)


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_timm_model_ema_classes_themselves_are_clean(version):
    """The same loop with the real timm.utils.ModelEmaV2 / ModelEmaV3(foreach=True)."""
    pytest.importorskip("timm")
    ema = load("ema_timm")
    twin(lambda: ema.build_timm(version), ema.train, ema.modules)


def _bn_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(inplace=True), nn.Linear(16, 3))


@pytest.mark.parametrize("how", ["swa", "ema_multi_avg", "ema_avg_fn_use_buffers"])
def test_swa_utils_averaged_model_update_parameters_and_update_bn_is_clean(how):
    """Modelled on the torch.optim.swa_utils recipe in the PyTorch docs: `AveragedModel(model)`,
    CosineAnnealingLR then `SWALR` after `swa_start`, `swa_model.update_parameters(model)` each
    epoch after it, `update_bn(loader, swa_model)` at the end, then a prediction of the averaged
    model; and the EMA forms `AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))`
    updated every step, and `avg_fn=get_ema_avg_fn(0.9), use_buffers=True`."""
    from torch.optim.swa_utils import SWALR, AveragedModel, get_ema_avg_fn, get_ema_multi_avg_fn, update_bn

    def build():
        model = _bn_mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if how == "swa":
            avg = AveragedModel(model)
        elif how == "ema_multi_avg":
            avg = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
        else:
            avg = AveragedModel(model, avg_fn=get_ema_avg_fn(0.9), use_buffers=True)
        return model, opt, avg

    def train(objs):
        model, opt, swa_model = objs
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4)
        swa_scheduler = SWALR(opt, swa_lr=0.05, anneal_epochs=1)
        loader = [(torch.randn(5, 6), torch.randint(0, 3, (5,))) for _ in range(2)]
        swa_start = 0
        for epoch in range(3):
            for x, y in loader:
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
                if how != "swa":
                    swa_model.update_parameters(model)
            if how == "swa" and epoch > swa_start:
                swa_model.update_parameters(model)
                swa_scheduler.step()
            else:
                scheduler.step()
        update_bn([x for x, _ in loader], swa_model)
        with torch.no_grad():
            return swa_model(torch.randn(4, 6))

    twin(build, train, lambda objs: (objs[0], objs[2]))


# ---------------------------------------------------------------------------
# 4. momentum encoders: MoCo v2, BYOL
# ---------------------------------------------------------------------------


def _encoder(dim: int = 8) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, dim),
    )


class MoCo(nn.Module):
    """facebookresearch/moco moco/builder.py (v2 with the MLP head), without the DDP shuffle."""

    def __init__(self, dim: int = 8, K: int = 16, m: float = 0.9, T: float = 0.2, clone_queue: bool = True):
        super().__init__()
        self.K, self.m, self.T, self.clone_queue = K, m, T, clone_queue
        self.encoder_q, self.encoder_k = _encoder(dim), _encoder(dim)
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data.copy_(param_q.data)
            param_k.requires_grad = False
        self.register_buffer("queue", torch.randn(dim, K))
        self.queue = F.normalize(self.queue, dim=0)
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data = param_k.data * self.m + param_q.data * (1.0 - self.m)

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        batch_size = keys.shape[0]
        ptr = int(self.queue_ptr)
        assert self.K % batch_size == 0
        self.queue[:, ptr : ptr + batch_size] = keys.T
        self.queue_ptr[0] = (ptr + batch_size) % self.K

    def forward(self, im_q, im_k):
        q = F.normalize(self.encoder_q(im_q), dim=1)
        with torch.no_grad():
            self._momentum_update_key_encoder()
            k = F.normalize(self.encoder_k(im_k), dim=1)
        l_pos = torch.einsum("nc,nc->n", [q, k]).unsqueeze(-1)
        queue = self.queue.clone().detach() if self.clone_queue else self.queue.detach()
        l_neg = torch.einsum("nc,ck->nk", [q, queue])
        logits = torch.cat([l_pos, l_neg], dim=1)
        logits /= self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long)
        self._dequeue_and_enqueue(k)
        return logits, labels


def _moco_train(objs, steps: int = 3):
    model, optimizer = objs
    criterion = nn.CrossEntropyLoss()
    for _ in range(steps):
        images = torch.randn(4, 3, 8, 8)
        im_q, im_k = images + 0.1 * torch.randn_like(images), images + 0.1 * torch.randn_like(images)
        output, target = model(im_q=im_q, im_k=im_k)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _moco_build(clone_queue: bool = True):
    model = MoCo(clone_queue=clone_queue)
    return model, torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9, weight_decay=1e-4)


def test_moco_v2_momentum_encoder_and_queue_enqueue_is_clean():
    """Modelled on MoCo v2 (facebookresearch/moco main_moco.py + moco/builder.py): key encoder
    updated by `param_k.data = param_k.data * m + param_q.data * (1 - m)` inside forward, keys
    under no_grad, `l_neg` against `self.queue.clone().detach()`, `logits /= T`, and
    `self.queue[:, ptr:ptr + bs] = keys.T` on the registered buffer before the loss's backward."""
    twin(_moco_build, _moco_train, lambda objs: (objs[0],))


def test_moco_queue_used_without_clone_then_enqueued_before_backward_is_flagged():
    """Hazard: the same MoCo forward with `self.queue.detach()` instead of `.clone().detach()`.
    einsum saves the queue (for the gradient w.r.t. q); the enqueue then writes it in place before
    `loss.backward()`. detach() shares the version counter: plain PyTorch raises (checked): IPD101."""

    def run(plain):
        torch.manual_seed(0)
        run.objs = _moco_build(clone_queue=False)
        if plain:
            _moco_train(run.objs, steps=1)
        else:
            with ipd.watch(run.objs[0]) as session:
                run.session = session
                _moco_train(run.objs, steps=1)

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        run(True)
    with pytest.raises(ipd.InplaceError):
        run(False)
    assert has_error(run.session.findings, "IPD101"), describe(run.session.findings)


class BYOL(nn.Module):
    """lucidrains/byol-pytorch: online encoder (backbone + projector with BatchNorm), predictor,
    target encoder made lazily by deepcopy with requires_grad off, both views in one batch,
    target projections under no_grad and `.detach_()`ed, symmetric normalized-MSE loss."""

    def __init__(self, beta: float = 0.9):
        super().__init__()
        self.online_encoder = nn.Sequential(_encoder(8), nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(inplace=True), nn.Linear(16, 8))
        self.online_predictor = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(inplace=True), nn.Linear(16, 8))
        self.target_encoder = None
        self.beta = beta

    def _get_target_encoder(self):
        if self.target_encoder is None:
            self.target_encoder = copy.deepcopy(self.online_encoder)
            for p in self.target_encoder.parameters():
                p.requires_grad = False
        return self.target_encoder

    @staticmethod
    def loss_fn(x, y):
        x, y = F.normalize(x, dim=-1, p=2), F.normalize(y, dim=-1, p=2)
        return 2 - 2 * (x * y).sum(dim=-1)

    def update_moving_average(self):
        for current_params, ma_params in zip(self.online_encoder.parameters(), self.target_encoder.parameters()):
            old_weight, up_weight = ma_params.data, current_params.data
            ma_params.data = old_weight * self.beta + (1 - self.beta) * up_weight

    def forward(self, x):
        image_one, image_two = x + 0.1 * torch.randn_like(x), x.flip(-1)
        images = torch.cat((image_one, image_two), dim=0)
        online_projections = self.online_encoder(images)
        online_predictions = self.online_predictor(online_projections)
        online_pred_one, online_pred_two = online_predictions.chunk(2, dim=0)
        with torch.no_grad():
            target_encoder = self._get_target_encoder()
            target_projections = target_encoder(images)
            target_projections = target_projections.detach()
            target_proj_one, target_proj_two = target_projections.chunk(2, dim=0)
        loss_one = self.loss_fn(online_pred_one, target_proj_two.detach())
        loss_two = self.loss_fn(online_pred_two, target_proj_one.detach())
        return (loss_one + loss_two).mean()


def test_byol_target_encoder_moving_average_is_clean():
    """Modelled on BYOL (lucidrains/byol-pytorch README loop): `loss = learner(images);
    opt.zero_grad(); loss.backward(); opt.step(); learner.update_moving_average()`, the moving
    average written as `ma_params.data = old * beta + (1 - beta) * new`."""

    def build():
        learner = BYOL()
        learner(torch.randn(4, 3, 8, 8))  # first call creates the target encoder (as the library's init does)
        return learner, torch.optim.Adam(learner.parameters(), lr=3e-3)

    def train(objs):
        learner, opt = objs
        for _ in range(3):
            loss = learner(torch.randn(4, 3, 8, 8))
            opt.zero_grad()
            loss.backward()
            opt.step()
            learner.update_moving_average()

    twin(build, train, lambda objs: (objs[0],))


# ---------------------------------------------------------------------------
# 5. WGAN weight clipping; DCGAN with spectral / weight norm
# ---------------------------------------------------------------------------


class MLP_G(nn.Module):
    def __init__(self, nz: int = 4, ngf: int = 16, out: int = 12):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(nz, ngf), nn.ReLU(True), nn.Linear(ngf, ngf), nn.ReLU(True), nn.Linear(ngf, out))

    def forward(self, z):
        return self.main(z.view(z.size(0), -1))


class MLP_D(nn.Module):
    def __init__(self, inp: int = 12, ndf: int = 16):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(inp, ndf), nn.ReLU(True), nn.Linear(ndf, ndf), nn.ReLU(True), nn.Linear(ndf, 1))

    def forward(self, x):
        return self.main(x).mean(0).view(1)


def _wgan_build():
    netG, netD = MLP_G(), MLP_D()
    for net in (netG, netD):  # DCGAN-style init: N(0, 0.02), so clipping at 0.01 bites
        for p in net.parameters():
            nn.init.normal_(p, 0.0, 0.02)
    return netG, netD, torch.optim.RMSprop(netG.parameters(), lr=5e-5), torch.optim.RMSprop(netD.parameters(), lr=5e-5)


def _wgan_train(objs, gen_iterations: int = 2, Diters: int = 3, clamp: float = 0.01, hazard: bool = False):
    netG, netD, optimizerG, optimizerD = objs
    one = torch.tensor([1.0])
    mone = one * -1
    noise = torch.empty(8, 4)
    for _ in range(gen_iterations):
        for p in netD.parameters():
            p.requires_grad = True
        for _ in range(Diters):
            if not hazard:
                for p in netD.parameters():
                    p.data.clamp_(-clamp, clamp)
            real = torch.randn(8, 12)
            netD.zero_grad()
            errD_real = netD(real)
            if hazard:  # HAZARD: clipped between the forward and the backward that reads the weights
                for p in netD.parameters():
                    p.data.clamp_(-clamp, clamp)
            errD_real.backward(one)
            noise.resize_(8, 4).normal_(0, 1)
            with torch.no_grad():  # `Variable(noise, volatile=True)`
                fake = netG(noise)
            errD_fake = netD(fake)
            errD_fake.backward(mone)
            errD = errD_real - errD_fake
            optimizerD.step()
        for p in netD.parameters():
            p.requires_grad = False
        netG.zero_grad()
        noise.resize_(8, 4).normal_(0, 1)
        fake = netG(noise)
        errG = netD(fake)
        errG.backward(one)
        optimizerG.step()
    return errD, errG


def test_wgan_critic_weight_clipping_through_data_is_clean():
    """Modelled on WGAN (Arjovsky, martinarjovsky/WassersteinGAN main.py, the MLP_G/MLP_D
    option): critic loop with `p.data.clamp_(-c, c)` at the top of each critic iteration,
    `errD_real.backward(one)`, fake from G without grad, `errD_fake.backward(mone)`, RMSprop step;
    `requires_grad` toggled off for the generator step; `noise.resize_(...).normal_(0, 1)` reused."""
    twin(_wgan_build, _wgan_train, lambda objs: objs[:2])


def test_wgan_clipping_between_critic_forward_and_backward_is_flagged():
    """Hazard: the same loop with the clip moved between `netD(real)` and `errD_real.backward(one)`.
    The critic's Linear layers saved their weights (for the gradient w.r.t. their inputs) and the
    clip rewrites them through `.data`, which moves no version counter. Checked in plain PyTorch:
    no error, but the critic's gradients differ from those of the unclipped forward it ran: silent
    wrong gradients, IPD104."""

    def grads(hazard):
        torch.manual_seed(0)
        objs = _wgan_build()
        netD = objs[1]
        real = torch.randn(8, 12)
        errD_real = netD(real)
        if hazard:
            for p in netD.parameters():
                p.data.clamp_(-0.01, 0.01)
        errD_real.backward(torch.tensor([1.0]))
        return [p.grad.clone() for p in netD.parameters()]

    good, bad = grads(False), grads(True)
    assert not all(torch.equal(a, b) for a, b in zip(good, bad))  # silently different gradients

    torch.manual_seed(0)
    objs = _wgan_build()
    with ipd.watch(*objs[:2]) as session:
        _wgan_train(objs, gen_iterations=1, Diters=1, hazard=True)
    assert has_error(session.findings, "IPD104"), describe(session.findings)


def _dcgan_nets(norm: str):
    nz = 4
    G = nn.Sequential(
        nn.ConvTranspose2d(nz, 8, 4, 1, 0, bias=False), nn.BatchNorm2d(8), nn.ReLU(True),
        nn.ConvTranspose2d(8, 3, 4, 2, 1, bias=False), nn.Tanh(),
    )
    D = nn.Sequential(
        nn.Conv2d(3, 8, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
        nn.Conv2d(8, 1, 4, 1, 0, bias=False), nn.Sigmoid(),
    )
    if norm == "hooks":  # the deprecated hook-based wrappers
        D[0] = nn.utils.spectral_norm(D[0])
        D[2] = nn.utils.spectral_norm(D[2])
        with pytest.warns(FutureWarning):
            G[0] = nn.utils.weight_norm(G[0])
            G[3] = nn.utils.weight_norm(G[3])
    elif norm == "parametrizations":
        D[0] = nn.utils.parametrizations.spectral_norm(D[0])
        D[2] = nn.utils.parametrizations.spectral_norm(D[2])
        G[0] = nn.utils.parametrizations.weight_norm(G[0])
        G[3] = nn.utils.parametrizations.weight_norm(G[3])
    return G, D


def _dcgan_build(norm: str = "parametrizations"):
    netG, netD = _dcgan_nets(norm)
    return (
        netG,
        netD,
        torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999)),
        torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999)),
    )


def _dcgan_train(objs, iters: int = 2):
    netG, netD, optimizerD, optimizerG = objs
    criterion = nn.BCELoss()
    real_label, fake_label = 1.0, 0.0
    for _ in range(iters):
        # (1) update D: maximize log(D(x)) + log(1 - D(G(z)))
        netD.zero_grad()
        real_cpu = torch.randn(4, 3, 8, 8)
        batch_size = real_cpu.size(0)
        label = torch.full((batch_size,), real_label)
        output = netD(real_cpu).view(-1)
        errD_real = criterion(output, label)
        errD_real.backward()
        D_x = output.mean().item()
        noise = torch.randn(batch_size, 4, 1, 1)
        fake = netG(noise)
        label.fill_(fake_label)
        output = netD(fake.detach()).view(-1)
        errD_fake = criterion(output, label)
        errD_fake.backward()
        D_G_z1 = output.mean().item()
        errD = errD_real + errD_fake
        optimizerD.step()
        # (2) update G: maximize log(D(G(z)))
        netG.zero_grad()
        label.fill_(real_label)
        output = netD(fake).view(-1)
        errG = criterion(output, label)
        errG.backward()
        D_G_z2 = output.mean().item()
        optimizerG.step()
    return errD.item(), errG.item(), D_x, D_G_z1, D_G_z2


@pytest.mark.parametrize("norm", ["none", "hooks", "parametrizations"])
def test_dcgan_step_with_spectral_and_weight_norm_is_clean(norm):
    """Modelled on pytorch/examples DCGAN (dcgan/main.py): D on real, `errD_real.backward()`,
    `label.fill_(fake_label)`, D on `fake.detach()`, `errD_fake.backward()`, optimizerD.step(),
    `label.fill_(real_label)`, D on `fake`, `errG.backward()`, optimizerG.step(). D's convs under
    `torch.nn.utils.spectral_norm` (power iteration writing `weight_u` in place each forward) or
    `parametrizations.spectral_norm` (`_u`/`_v` written with `out=`), G's under the deprecated
    `torch.nn.utils.weight_norm` or `parametrizations.weight_norm`."""
    twin(lambda: _dcgan_build(norm), _dcgan_train, lambda objs: objs[:2])


def test_dcgan_label_refilled_before_the_joint_backward_is_flagged():
    """Hazard: the DCGAN D step with one joint backward (`(errD_real + errD_fake).backward()`) but
    DCGAN's `label.fill_(fake_label)` kept between the two forwards: BCELoss saved `label` as its
    target for errD_real, the fill rewrites it before backward. Plain PyTorch raises (checked): IPD101."""

    def step(objs):
        netG, netD, optimizerD, _ = objs
        criterion = nn.BCELoss()
        netD.zero_grad()
        real = torch.randn(4, 3, 8, 8)
        label = torch.full((4,), 1.0)
        errD_real = criterion(netD(real).view(-1), label)
        fake = netG(torch.randn(4, 4, 1, 1))
        label.fill_(0.0)  # HAZARD: BCELoss saved `label` for errD_real
        errD_fake = criterion(netD(fake.detach()).view(-1), label)
        (errD_real + errD_fake).backward()
        optimizerD.step()

    torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        step(_dcgan_build("none"))
    torch.manual_seed(0)
    objs = _dcgan_build("none")
    with pytest.raises(ipd.InplaceError), ipd.watch(*objs[:2]) as session:
        step(objs)
    assert has_error(session.findings, "IPD101"), describe(session.findings)


# ---------------------------------------------------------------------------
# 6. CycleGAN image pool
# ---------------------------------------------------------------------------


class ImagePool:
    """junyanz/pytorch-CycleGAN-and-pix2pix util/image_pool.py."""

    def __init__(self, pool_size: int):
        self.pool_size = pool_size
        self.num_imgs = 0
        self.images: list[torch.Tensor] = []

    def query(self, images):
        if self.pool_size == 0:
            return images
        return_images = []
        for image in images:
            image = torch.unsqueeze(image.data, 0)
            if self.num_imgs < self.pool_size:  # fill the pool first
                self.num_imgs += 1
                self.images.append(image)
                return_images.append(image)
            elif random.uniform(0, 1) > 0.5:  # hand back an old image, keep the new one
                random_id = random.randint(0, self.pool_size - 1)
                tmp = self.images[random_id].clone()
                self.images[random_id] = image
                return_images.append(tmp)
            else:
                return_images.append(image)
        return torch.cat(return_images, 0)


class GANLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("real_label", torch.tensor(1.0))
        self.register_buffer("fake_label", torch.tensor(0.0))
        self.loss = nn.MSELoss()  # lsgan

    def __call__(self, prediction, target_is_real):
        target = (self.real_label if target_is_real else self.fake_label).expand_as(prediction)
        return self.loss(prediction, target)


def _cyc_G():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.InstanceNorm2d(8), nn.ReLU(True), nn.Conv2d(8, 3, 3, padding=1), nn.Tanh()
    )


def _cyc_D():
    return nn.Sequential(nn.Conv2d(3, 8, 4, 2, 1), nn.LeakyReLU(0.2, True), nn.Conv2d(8, 1, 3, 1, 1))


class CycleGANModel:
    """models/cycle_gan_model.py: forward, set_requires_grad(D, False), backward_G, step,
    set_requires_grad(D, True), backward_D_A / backward_D_B through the image pools, step."""

    def __init__(self):
        self.netG_A, self.netG_B, self.netD_A, self.netD_B = _cyc_G(), _cyc_G(), _cyc_D(), _cyc_D()
        self.fake_A_pool, self.fake_B_pool = ImagePool(3), ImagePool(3)
        self.criterionGAN, self.criterionCycle, self.criterionIdt = GANLoss(), nn.L1Loss(), nn.L1Loss()
        self.lambda_A = self.lambda_B = 10.0
        self.lambda_idt = 0.5
        self.optimizer_G = torch.optim.Adam(itertools.chain(self.netG_A.parameters(), self.netG_B.parameters()), lr=2e-3, betas=(0.5, 0.999))
        self.optimizer_D = torch.optim.Adam(itertools.chain(self.netD_A.parameters(), self.netD_B.parameters()), lr=2e-3, betas=(0.5, 0.999))

    @staticmethod
    def set_requires_grad(nets, requires_grad=False):
        for net in nets:
            for param in net.parameters():
                param.requires_grad = requires_grad

    def forward(self):
        self.fake_B = self.netG_A(self.real_A)
        self.rec_A = self.netG_B(self.fake_B)
        self.fake_A = self.netG_B(self.real_B)
        self.rec_B = self.netG_A(self.fake_A)

    def backward_D_basic(self, netD, real, fake):
        loss_D_real = self.criterionGAN(netD(real), True)
        loss_D_fake = self.criterionGAN(netD(fake.detach()), False)
        loss_D = (loss_D_real + loss_D_fake) * 0.5
        loss_D.backward()
        return loss_D

    def backward_D_A(self):
        fake_B = self.fake_B_pool.query(self.fake_B)
        self.loss_D_A = self.backward_D_basic(self.netD_A, self.real_B, fake_B)

    def backward_D_B(self):
        fake_A = self.fake_A_pool.query(self.fake_A)
        self.loss_D_B = self.backward_D_basic(self.netD_B, self.real_A, fake_A)

    def backward_G(self):
        self.idt_A = self.netG_A(self.real_B)
        self.loss_idt_A = self.criterionIdt(self.idt_A, self.real_B) * self.lambda_B * self.lambda_idt
        self.idt_B = self.netG_B(self.real_A)
        self.loss_idt_B = self.criterionIdt(self.idt_B, self.real_A) * self.lambda_A * self.lambda_idt
        self.loss_G_A = self.criterionGAN(self.netD_A(self.fake_B), True)
        self.loss_G_B = self.criterionGAN(self.netD_B(self.fake_A), True)
        self.loss_cycle_A = self.criterionCycle(self.rec_A, self.real_A) * self.lambda_A
        self.loss_cycle_B = self.criterionCycle(self.rec_B, self.real_B) * self.lambda_B
        self.loss_G = self.loss_G_A + self.loss_G_B + self.loss_cycle_A + self.loss_cycle_B + self.loss_idt_A + self.loss_idt_B
        self.loss_G.backward()

    def optimize_parameters(self):
        self.forward()
        self.set_requires_grad([self.netD_A, self.netD_B], False)
        self.optimizer_G.zero_grad()
        self.backward_G()
        self.optimizer_G.step()
        self.set_requires_grad([self.netD_A, self.netD_B], True)
        self.optimizer_D.zero_grad()
        self.backward_D_A()
        self.backward_D_B()
        self.optimizer_D.step()


def test_cyclegan_image_pool_and_alternating_updates_are_clean():
    """Modelled on CycleGAN (junyanz/pytorch-CycleGAN-and-pix2pix): ImagePool.query storing
    `image.data` of generated images and handing back clones of old ones, optimize_parameters'
    order (G step with D frozen, then both D's on pooled fakes), lsgan GANLoss on expanded label
    buffers. The model's attributes (fake_B, rec_A, ...) keep their graphs alive across steps."""

    def train(model):
        random.seed(0)
        for _ in range(3):
            model.real_A, model.real_B = torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8)
            model.optimize_parameters()

    twin(CycleGANModel, train, lambda m: (m.netG_A, m.netG_B, m.netD_A, m.netD_B))


# ---------------------------------------------------------------------------
# 7. truncated BPTT, distillation, accumulation + clipping + GradScaler/autocast
# ---------------------------------------------------------------------------


class RNNModel(nn.Module):
    """pytorch/examples word_language_model model.py (encoder, dropout, LSTM/GRU, decoder, tied)."""

    def __init__(self, rnn_type: str, ntoken: int = 20, ninp: int = 8, nhid: int = 8, nlayers: int = 2, dropout: float = 0.2):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.decoder.weight = self.encoder.weight  # tie_weights
        self.rnn_type, self.nhid, self.nlayers, self.ntoken = rnn_type, nhid, nlayers, ntoken

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        if self.rnn_type == "LSTM":
            return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))
        return weight.new_zeros(self.nlayers, bsz, self.nhid)


def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


@pytest.mark.parametrize("rnn_type", ["LSTM", "GRU"])
def test_word_language_model_truncated_bptt_with_repackage_hidden_is_clean(rnn_type):
    """Modelled on pytorch/examples word_language_model main.py `train()`: hidden state carried
    across bptt chunks and `repackage_hidden` (detach) at each, `model.zero_grad()`, NLL loss,
    backward, `clip_grad_norm_`, then the manual SGD `p.data.add_(p.grad, alpha=-lr)`."""
    bsz, bptt, lr = 3, 4, 2.0

    def train(model):
        model.train()
        data = torch.randint(0, 20, (3 * bptt + 1, bsz))
        hidden = model.init_hidden(bsz)
        for i in range(0, data.size(0) - 1, bptt):
            seq_len = min(bptt, len(data) - 1 - i)
            x, targets = data[i : i + seq_len], data[i + 1 : i + 1 + seq_len].reshape(-1)
            model.zero_grad()
            hidden = repackage_hidden(hidden)
            output, hidden = model(x, hidden)
            loss = F.nll_loss(output, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)

    twin(lambda: RNNModel(rnn_type), train, lambda m: (m,))


def test_knowledge_distillation_with_teacher_under_no_grad_is_clean():
    """Modelled on the PyTorch Knowledge Distillation tutorial `train_knowledge_distillation`:
    teacher.eval() and its logits under no_grad, student.train(), soft-target loss
    `sum(soft_targets * (soft_targets.log() - soft_prob)) / batch * T**2` plus cross-entropy."""

    def build():
        teacher = nn.Sequential(nn.Flatten(), nn.Linear(48, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 5))
        student = nn.Sequential(nn.Flatten(), nn.Linear(48, 8), nn.ReLU(inplace=True), nn.Linear(8, 5))
        return teacher, student, torch.optim.Adam(student.parameters(), lr=1e-2)

    def train(objs, T=2.0, soft_target_loss_weight=0.25, ce_loss_weight=0.75):
        teacher, student, optimizer = objs
        ce_loss = nn.CrossEntropyLoss()
        teacher.eval()
        student.train()
        for _ in range(3):
            inputs, labels = torch.randn(4, 3, 4, 4), torch.randint(0, 5, (4,))
            optimizer.zero_grad()
            with torch.no_grad():
                teacher_logits = teacher(inputs)
            student_logits = student(inputs)
            soft_targets = F.softmax(teacher_logits / T, dim=-1)
            soft_prob = F.log_softmax(student_logits / T, dim=-1)
            soft_targets_loss = torch.sum(soft_targets * (soft_targets.log() - soft_prob)) / soft_prob.size()[0] * (T**2)
            label_loss = ce_loss(student_logits, labels)
            loss = soft_target_loss_weight * soft_targets_loss + ce_loss_weight * label_loss
            loss.backward()
            optimizer.step()

    twin(build, train, lambda objs: objs[:2])


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.resid_dropout = nn.Dropout(0.1)
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1 if self.training else 0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(n_embd), CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd), nn.Dropout(0.1))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """karpathy/nanoGPT model.py, one block, weight tying wte <-> lm_head."""

    def __init__(self, vocab: int = 32, block_size: int = 8, n_embd: int = 16, n_head: int = 2):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block_size, n_embd)
        self.drop, self.h, self.ln_f = nn.Dropout(0.1), nn.ModuleList([Block(n_embd, n_head)]), nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        pos = torch.arange(0, idx.size(1), dtype=torch.long)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=False)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_nanogpt_accumulation_clipping_grad_scaler_and_cpu_autocast_is_clean(dtype):
    """Modelled on karpathy/nanoGPT train.py: cosine/warm-up `get_lr` written into every param
    group, `gradient_accumulation_steps` micro-steps under `torch.autocast` with the next batch
    fetched between forward and backward, `scaler.scale(loss).backward()`,
    `scaler.unscale_(optimizer)` + `clip_grad_norm_`, `scaler.step`, `scaler.update`,
    `zero_grad(set_to_none=True)`; GradScaler enabled only for float16 (as there), on CPU."""
    ptdtype = getattr(torch, dtype)

    def build():
        model = GPT()
        return model, model.configure_optimizers(0.1, 6e-3, (0.9, 0.95)), torch.amp.GradScaler("cpu", enabled=(dtype == "float16"))

    def get_lr(it, warmup_iters=1, lr_decay_iters=4, learning_rate=6e-3, min_lr=6e-4):
        if it < warmup_iters:
            return learning_rate * (it + 1) / (warmup_iters + 1)
        decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * decay_ratio)) * (learning_rate - min_lr)

    def get_batch():
        data = torch.randint(0, 32, (3, 9))
        return data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def train(objs, iters=2, gradient_accumulation_steps=2, grad_clip=1.0):
        model, optimizer, scaler = objs
        ctx = torch.autocast(device_type="cpu", dtype=ptdtype)
        X, Y = get_batch()
        for iter_num in range(iters):
            lr = get_lr(iter_num)
            for param_group in optimizer.param_groups:
                param_group["lr"] = lr
            for _ in range(gradient_accumulation_steps):
                with ctx:
                    logits, loss = model(X, Y)
                    loss = loss / gradient_accumulation_steps
                X, Y = get_batch()
                scaler.scale(loss).backward()
            if grad_clip != 0.0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            loss.item() * gradient_accumulation_steps
        assert logits.dtype == ptdtype

    twin(build, train, lambda objs: (objs[0],))


# ---------------------------------------------------------------------------
# 8. L-BFGS with a closure; TRPO line search through .data.copy_
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("line_search_fn", [None, "strong_wolfe"])
def test_lbfgs_closure_on_float64_lstmcells_is_clean(line_search_fn):
    """Modelled on pytorch/examples time_sequence_prediction train.py: two float64 LSTMCells
    unrolled over `input.split(1, dim=1)` plus future steps fed back, `optim.LBFGS(lr=0.8)` with a
    closure (zero_grad, forward, MSE, backward, return loss), a no_grad prediction after each step;
    with and without `line_search_fn="strong_wolfe"` (which re-evaluates the closure at trial
    points and writes the parameters back with `copy_`)."""
    seq = load("lstmcell_sine")
    twin(lambda: seq.build(line_search_fn), seq.train, seq.modules)


class TRPOPolicy(nn.Module):
    def __init__(self, num_inputs: int = 4, num_outputs: int = 2):
        super().__init__()
        self.affine1, self.affine2 = nn.Linear(num_inputs, 16), nn.Linear(16, 16)
        self.action_mean = nn.Linear(16, num_outputs)
        self.action_mean.weight.data.mul_(0.1)
        self.action_mean.bias.data.mul_(0.0)
        self.action_log_std = nn.Parameter(torch.zeros(1, num_outputs))

    def forward(self, x):
        x = torch.tanh(self.affine2(torch.tanh(self.affine1(x))))
        action_mean = self.action_mean(x)
        action_log_std = self.action_log_std.expand_as(action_mean)
        return action_mean, action_log_std, torch.exp(action_log_std)


class TRPOValue(nn.Module):
    def __init__(self, num_inputs: int = 4):
        super().__init__()
        self.affine1, self.affine2 = nn.Linear(num_inputs, 16), nn.Linear(16, 16)
        self.value_head = nn.Linear(16, 1)
        self.value_head.weight.data.mul_(0.1)
        self.value_head.bias.data.mul_(0.0)

    def forward(self, x):
        return self.value_head(torch.tanh(self.affine2(torch.tanh(self.affine1(x)))))


def normal_log_density(x, mean, log_std, std):
    var = std.pow(2)
    log_density = -(x - mean).pow(2) / (2 * var) - 0.5 * math.log(2 * math.pi) - log_std
    return log_density.sum(1, keepdim=True)


def get_flat_params_from(model):
    return torch.cat([param.data.view(-1) for param in model.parameters()])


def set_flat_params_to(model, flat_params):
    prev_ind = 0
    for param in model.parameters():
        flat_size = int(np.prod(list(param.size())))
        param.data.copy_(flat_params[prev_ind : prev_ind + flat_size].view(param.size()))
        prev_ind += flat_size


def get_flat_grad_from(net):
    return torch.cat([param.grad.view(-1) for param in net.parameters()])


def conjugate_gradients(Avp, b, nsteps, residual_tol=1e-10):
    x = torch.zeros(b.size())
    r, p = b.clone(), b.clone()
    rdotr = torch.dot(r, r)
    for _ in range(nsteps):
        _Avp = Avp(p)
        alpha = rdotr / torch.dot(p, _Avp)
        x += alpha * p
        r -= alpha * _Avp
        new_rdotr = torch.dot(r, r)
        p = r + (new_rdotr / rdotr) * p
        rdotr = new_rdotr
        if rdotr < residual_tol:
            break
    return x


def linesearch(model, f, x, fullstep, expected_improve_rate, max_backtracks=5, accept_ratio=0.1):
    fval = f(True).data
    for stepfrac in 0.5 ** np.arange(max_backtracks):
        xnew = x + float(stepfrac) * fullstep
        set_flat_params_to(model, xnew)
        newfval = f(True).data
        actual_improve = fval - newfval
        expected_improve = expected_improve_rate * float(stepfrac)
        ratio = actual_improve / expected_improve
        if ratio.item() > accept_ratio and actual_improve.item() > 0:
            return True, xnew
    return False, x


def trpo_step(model, get_loss, get_kl, max_kl, damping):
    loss = get_loss()
    grads = torch.autograd.grad(loss, model.parameters())
    loss_grad = torch.cat([grad.view(-1) for grad in grads]).data

    def Fvp(v):
        kl = get_kl().mean()
        grads = torch.autograd.grad(kl, model.parameters(), create_graph=True)
        flat_grad_kl = torch.cat([grad.view(-1) for grad in grads])
        kl_v = (flat_grad_kl * v).sum()
        grads = torch.autograd.grad(kl_v, model.parameters())
        flat_grad_grad_kl = torch.cat([grad.contiguous().view(-1) for grad in grads]).data
        return flat_grad_grad_kl + v * damping

    stepdir = conjugate_gradients(Fvp, -loss_grad, 5)
    shs = 0.5 * (stepdir * Fvp(stepdir)).sum(0, keepdim=True)
    lm = torch.sqrt(shs / max_kl)
    fullstep = stepdir / lm[0]
    neggdotstepdir = (-loss_grad * stepdir).sum(0, keepdim=True)
    prev_params = get_flat_params_from(model)
    success, new_params = linesearch(model, get_loss, prev_params, fullstep, neggdotstepdir / lm[0])
    set_flat_params_to(model, new_params)
    return loss


def trpo_update_params(policy_net, value_net, batch, gamma=0.99, tau=0.97, l2_reg=1e-3, max_kl=1e-2, damping=1e-1):
    """ikostrikov/pytorch-trpo main.py `update_params` (scipy's fmin_l_bfgs_b replaced by a few
    gradient-descent evaluations of the same `get_value_loss`: scipy is not a test dependency)."""
    rewards, masks, actions, states = batch
    values = value_net(states)  # with grad; only values.data is read: a graph never backpropagated
    returns = torch.Tensor(actions.size(0), 1)
    deltas = torch.Tensor(actions.size(0), 1)
    advantages = torch.Tensor(actions.size(0), 1)
    prev_return = prev_value = prev_advantage = 0
    for i in reversed(range(rewards.size(0))):
        returns[i] = rewards[i] + gamma * prev_return * masks[i]
        deltas[i] = rewards[i] + gamma * prev_value * masks[i] - values.data[i]
        advantages[i] = deltas[i] + gamma * tau * prev_advantage * masks[i]
        prev_return, prev_value, prev_advantage = returns[i, 0], values.data[i, 0], advantages[i, 0]
    targets = returns

    def get_value_loss(flat_params):
        set_flat_params_to(value_net, torch.Tensor(flat_params))
        for param in value_net.parameters():
            if param.grad is not None:
                param.grad.data.fill_(0)
        values_ = value_net(states)
        value_loss = (values_ - targets).pow(2).mean()
        for param in value_net.parameters():
            value_loss += param.pow(2).sum() * l2_reg
        value_loss.backward()
        return value_loss.data.double().numpy(), get_flat_grad_from(value_net).data.double().numpy()

    flat_params = get_flat_params_from(value_net).double().numpy()
    for _ in range(3):
        _, g = get_value_loss(flat_params)
        flat_params = flat_params - 0.05 * g
    set_flat_params_to(value_net, torch.Tensor(flat_params))

    advantages = (advantages - advantages.mean()) / advantages.std()
    action_means, action_log_stds, action_stds = policy_net(states)  # graph alive, never backpropagated
    fixed_log_prob = normal_log_density(actions, action_means, action_log_stds, action_stds).data.clone()

    def get_loss(volatile=False):
        if volatile:
            with torch.no_grad():
                action_means, action_log_stds, action_stds = policy_net(states)
        else:
            action_means, action_log_stds, action_stds = policy_net(states)
        log_prob = normal_log_density(actions, action_means, action_log_stds, action_stds)
        action_loss = -advantages * torch.exp(log_prob - fixed_log_prob)
        return action_loss.mean()

    def get_kl():
        mean1, log_std1, std1 = policy_net(states)
        mean0, log_std0, std0 = mean1.data, log_std1.data, std1.data
        kl = log_std1 - log_std0 + (std0.pow(2) + (mean0 - mean1).pow(2)) / (2.0 * std1.pow(2)) - 0.5
        return kl.sum(1, keepdim=True)

    return trpo_step(policy_net, get_loss, get_kl, max_kl, damping)


def test_trpo_conjugate_gradient_and_linesearch_writing_flat_params_through_data_is_clean():
    """Modelled on TRPO (ikostrikov/pytorch-trpo trpo.py + main.py): value net fitted by repeated
    `get_value_loss(flat)` (set_flat_params_to via `param.data.copy_`, `param.grad.data.fill_(0)`,
    `value_loss += l2 term`, backward) while `values = value_net(states)` is alive; the surrogate
    `loss = get_loss()` differentiated with autograd.grad, Fisher-vector products with
    create_graph=True, conjugate gradients, and `linesearch` writing the policy's parameters with
    `.data.copy_` from a flat vector while that surrogate graph and `action_means` are still alive."""

    def build():
        return TRPOPolicy(), TRPOValue()

    def train(objs):
        policy_net, value_net = objs
        for _ in range(2):
            states, actions = torch.randn(12, 4), torch.randn(12, 2)
            rewards, masks = torch.randn(12), (torch.rand(12) > 0.2).float()
            loss = trpo_update_params(policy_net, value_net, (rewards, masks, actions, states))
        return loss

    twin(build, train, lambda objs: objs)


# ---------------------------------------------------------------------------
# 9. MAML inner loops
# ---------------------------------------------------------------------------


def clone_module(module: nn.Module) -> nn.Module:
    """learn2learn.utils.clone_module: a shallow copy whose parameters are differentiable clones."""
    clone = module.__new__(type(module))
    clone.__dict__ = module.__dict__.copy()
    clone._parameters = module._parameters.copy()
    clone._buffers = module._buffers.copy()
    clone._modules = module._modules.copy()
    for key, param in module._parameters.items():
        if param is not None:
            clone._parameters[key] = param.clone()
    for key, buff in module._buffers.items():
        if buff is not None and buff.requires_grad:
            clone._buffers[key] = buff.clone()
    for key, child in module._modules.items():
        clone._modules[key] = clone_module(child)
    return clone


def update_module(module: nn.Module, updates=None) -> nn.Module:
    """learn2learn.utils.update_module: `p.update` set from `updates`, then `_parameters[k] = p + p.update`."""
    if updates is not None:
        for p, g in zip(list(module.parameters()), updates):
            p.update = g
    for key, p in module._parameters.items():
        if p is not None and getattr(p, "update", None) is not None:
            module._parameters[key] = p + p.update
    for key, child in module._modules.items():
        module._modules[key] = update_module(child, updates=None)
    return module


def _maml_net() -> nn.Module:
    return nn.Sequential(
        nn.Linear(6, 16), nn.BatchNorm1d(16, track_running_stats=False), nn.ReLU(), nn.Linear(16, 3)
    )


def _task():
    return torch.randn(6, 6), torch.randint(0, 3, (6,)), torch.randn(6, 6), torch.randint(0, 3, (6,))


class Learner(nn.Module):
    """dragen1860/MAML-Pytorch learner.py: weights in a ParameterList, BN running stats as
    non-trainable parameters updated by F.batch_norm in training mode, `vars=` for fast weights."""

    def __init__(self):
        super().__init__()
        w1, w2 = torch.empty(16, 6), torch.empty(3, 16)
        nn.init.kaiming_normal_(w1)
        nn.init.kaiming_normal_(w2)
        self.vars = nn.ParameterList([
            nn.Parameter(w1), nn.Parameter(torch.zeros(16)),
            nn.Parameter(torch.ones(16)), nn.Parameter(torch.zeros(16)),  # bn weight, bias
            nn.Parameter(w2), nn.Parameter(torch.zeros(3)),
        ])
        self.vars_bn = nn.ParameterList([nn.Parameter(torch.zeros(16), requires_grad=False), nn.Parameter(torch.ones(16), requires_grad=False)])

    def forward(self, x, vars=None, bn_training=True):
        vars = self.vars if vars is None else vars
        x = F.linear(x, vars[0], vars[1])
        x = F.batch_norm(x, self.vars_bn[0], self.vars_bn[1], weight=vars[2], bias=vars[3], training=bn_training)
        x = F.relu(x, inplace=True)
        return F.linear(x, vars[4], vars[5])


def maml_functional_call(model: nn.Module, inner_lr: float, tasks: int, inner_steps: int) -> None:
    """Fast weights as a dict through `torch.func.functional_call`; each task's query loss backward."""
    params = dict(model.named_parameters())
    for _ in range(tasks):
        xs, ys, xq, yq = _task()
        fast = params
        for _ in range(inner_steps):
            loss = F.cross_entropy(torch.func.functional_call(model, fast, (xs,)), ys)
            grads = torch.autograd.grad(loss, list(fast.values()), create_graph=True)
            fast = {n: p - inner_lr * g for (n, p), g in zip(fast.items(), grads)}
        (F.cross_entropy(torch.func.functional_call(model, fast, (xq,)), yq) / tasks).backward()


def maml_learn2learn(model: nn.Module, inner_lr: float, tasks: int, inner_steps: int) -> None:
    """learn2learn's `clone_module` / `update_module`, each task's evaluation error backward, then
    the gradients averaged through `.data`."""
    for _ in range(tasks):
        learner = clone_module(model)
        xs, ys, xq, yq = _task()
        for _ in range(inner_steps):
            train_error = F.cross_entropy(learner(xs), ys)
            gradients = torch.autograd.grad(train_error, learner.parameters(), retain_graph=True, create_graph=True)
            learner = update_module(learner, updates=[-inner_lr * g for g in gradients])
        evaluation_error = F.cross_entropy(learner(xq), yq)
        evaluation_error.backward()
    for p in model.parameters():
        p.grad.data.mul_(1.0 / tasks)


def maml_manual_fast_weights(model: nn.Module, inner_lr: float, tasks: int, inner_steps: int) -> None:
    """dragen1860/MAML-Pytorch meta.py's fast weights as a list, the query losses summed per step."""
    losses_q = [0 for _ in range(inner_steps + 1)]
    for _ in range(tasks):
        xs, ys, xq, yq = _task()
        loss = F.cross_entropy(model(xs, vars=None, bn_training=True), ys)
        grad = torch.autograd.grad(loss, model.vars.parameters(), create_graph=True)
        fast_weights = list(map(lambda p: p[1] - inner_lr * p[0], zip(grad, model.vars.parameters())))
        with torch.no_grad():
            losses_q[0] += F.cross_entropy(model(xq, model.vars, bn_training=True), yq)
        for k in range(1, inner_steps):
            loss = F.cross_entropy(model(xs, fast_weights, bn_training=True), ys)
            grad = torch.autograd.grad(loss, fast_weights, create_graph=True)
            fast_weights = list(map(lambda p: p[1] - inner_lr * p[0], zip(grad, fast_weights)))
            loss_q = F.cross_entropy(model(xq, fast_weights, bn_training=True), yq)
            losses_q[k + 1] += loss_q
    loss_q = losses_q[-1] / tasks
    loss_q.backward()


# One meta-iteration's gradients into the meta-parameters, as each library writes the inner loop.
MAML_META_GRADIENTS = {
    "functional_call": maml_functional_call,
    "learn2learn": maml_learn2learn,
    "manual_fast_weights": maml_manual_fast_weights,
}


@pytest.mark.parametrize("how", list(MAML_META_GRADIENTS))
def test_maml_second_order_inner_loop_is_clean(how):
    """MAML inner loops with create_graph=True, 2 tasks x 2 inner steps, one meta step per
    iteration:
    - functional_call: fast weights as a dict through `torch.func.functional_call` (higher /
      torch.func style), query loss of each task backpropagated into the meta-parameters;
    - learn2learn: `clone_module` / `update_module` (learn2learn MAML.clone + adapt, parameters
      replaced by non-leaf tensors in `_parameters`), examples/maml_omniglot.py's loop with
      `evaluation_error.backward()` per task and `p.grad.data.mul_(1.0 / meta_batch_size)`;
    - manual_fast_weights: dragen1860/MAML-Pytorch meta.py (`fast_weights = list(map(lambda p:
      p[1] - lr * p[0], zip(grad, weights)))`, in-place ReLU, BN running stats written in every
      inner forward, `losses_q[k] += loss_q`), with create_graph=True for second order."""
    inner_lr, tasks, inner_steps = 0.1, 2, 2

    def build():
        model = Learner() if how == "manual_fast_weights" else _maml_net()
        return model, torch.optim.Adam(model.parameters(), lr=1e-2)

    def train(objs):
        model, meta_opt = objs
        for _ in range(2):
            meta_opt.zero_grad()
            MAML_META_GRADIENTS[how](model, inner_lr, tasks, inner_steps)
            meta_opt.step()

    twin(build, train, lambda objs: (objs[0],))


# ---------------------------------------------------------------------------
# 10. adversarial examples writing delta.data
# ---------------------------------------------------------------------------


def _adv_model():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 5))


def pgd_linf(model, X, y, epsilon=0.1, alpha=0.02, num_iter=3):
    """adversarial-ml-tutorial (Kolter & Madry) chapter 4 `pgd_linf`."""
    delta = torch.zeros_like(X, requires_grad=True)
    for _ in range(num_iter):
        loss = nn.CrossEntropyLoss()(model(X + delta), y)
        loss.backward()
        delta.data = (delta + alpha * delta.grad.detach().sign()).clamp(-epsilon, epsilon)
        delta.grad.zero_()
    return delta.detach()


def clamp(X, lower_limit, upper_limit):
    return torch.max(torch.min(X, upper_limit), lower_limit)


@pytest.mark.parametrize("how", ["madry_pgd", "wong_fgsm_rs", "free"])
def test_adversarial_training_writing_delta_data_is_clean(how):
    """- madry_pgd: adversarial-ml-tutorial (Kolter & Madry) `epoch_adversarial` with `pgd_linf`
      (`delta.data = (delta + alpha*delta.grad.sign()).clamp(-eps, eps)`, `delta.grad.zero_()`;
      the attack's backwards also fill the model's .grad, cleared by opt.zero_grad());
    - wong_fgsm_rs: locuslab/fast_adversarial train_fgsm.py (random start `uniform_`,
      `delta.data = clamp(delta + alpha*sign(grad), -eps, eps)`, `delta.data[:n] = clamp(...)`);
    - free: mahyarnajibi/FreeAdversarialTraining main_free.py (one global noise buffer sliced
      into a leaf that requires grad, `in1.clamp_(0, 1)` on the perturbed input, replays with
      `global_noise_data += pert.data; global_noise_data.clamp_(-eps, eps)` then optimizer.step)."""
    eps, alpha = 0.1, 0.02

    def build():
        model = _adv_model()
        return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def train(objs):
        model, opt = objs
        lower_limit, upper_limit = torch.zeros(1, 3, 1, 1), torch.ones(1, 3, 1, 1)
        epsilon = torch.full((1, 3, 1, 1), eps)  # per-channel tensors, as train_fgsm.py builds them from std
        global_noise_data = torch.zeros(4, 3, 6, 6)
        for _ in range(2):
            X, y = torch.rand(4, 3, 6, 6), torch.randint(0, 5, (4,))
            if how == "madry_pgd":
                delta = pgd_linf(model, X, y, epsilon=eps, alpha=alpha)
                loss = nn.CrossEntropyLoss()(model(X + delta), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            elif how == "wong_fgsm_rs":
                delta = torch.zeros_like(X).uniform_(-eps, eps)
                delta.data = clamp(delta, lower_limit - X, upper_limit - X)
                delta.requires_grad = True
                output = model(X + delta[: X.size(0)])
                loss = F.cross_entropy(output, y)
                loss.backward()
                grad = delta.grad.detach()
                delta.data = clamp(delta + alpha * torch.sign(grad), -epsilon, epsilon)
                delta.data[: X.size(0)] = clamp(delta[: X.size(0)], lower_limit - X, upper_limit - X)
                delta = delta.detach()
                output = model(X + delta[: X.size(0)])
                loss = F.cross_entropy(output, y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            else:
                for _ in range(2):  # n_repeats
                    noise_batch = global_noise_data[0 : X.size(0)].detach().requires_grad_(True)
                    in1 = X + noise_batch
                    in1.clamp_(0, 1.0)
                    output = model(in1)
                    loss = F.cross_entropy(output, y)
                    opt.zero_grad()
                    loss.backward()
                    pert = alpha * torch.sign(noise_batch.grad)
                    global_noise_data[0 : X.size(0)] += pert.data
                    global_noise_data.clamp_(-eps, eps)
                    opt.step()

    twin(build, train, lambda objs: (objs[0],))


# ---------------------------------------------------------------------------
# 11. a torch.Tensor subclass from a fresh tensor (BigGAN's Distribution)
# ---------------------------------------------------------------------------


def test_biggan_distribution_tensor_subclass_and_held_state_dict_ema_is_clean():
    """Modelled on ajbrock/BigGAN-PyTorch: utils.Distribution(torch.Tensor) built as
    `Distribution(torch.randn(...))`, `.to()` override assigning `.data`, in-place `sample_()`
    before every D and G accumulation, G_D wrapper, hinge losses, train_fns.GAN_training_function,
    and utils.ema holding both state_dicts from construction (`target_dict[k].data.copy_(...)`)."""
    bg = load("biggan_distribution")
    twin(bg.build, bg.train, bg.modules)
    # The setup watched too, as `inplace-doctor run` watches it: `ema.__init__` takes the state_dicts.
    torch.manual_seed(0)
    with ipd.watch() as session:
        bg.train(bg.build())
    assert_clean(session)


# ---------------------------------------------------------------------------
# 12. every torch.nn recurrent layer and cell, one training step
# ---------------------------------------------------------------------------

RNN_CASES = (
    [pytest.param(kind, dtype, {}, id=f"{kind}-{str(dtype)[6:]}") for kind in ("RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell") for dtype in (torch.float32, torch.float64)]
    + [
        pytest.param("LSTM", torch.float32, {"proj_size": 3}, id="LSTM-proj-float32"),
        pytest.param("LSTM", torch.float64, {"proj_size": 3}, id="LSTM-proj-float64"),
        pytest.param("RNN", torch.float32, {"bidirectional": True, "nonlinearity": "relu"}, id="RNN-relu-bidirectional"),
        pytest.param("LSTM", torch.float32, {"bidirectional": True, "batch_first": True}, id="LSTM-bidirectional-batch_first"),
        pytest.param("GRU", torch.float32, {"bidirectional": True, "dropout": 0.2}, id="GRU-bidirectional-dropout"),
        pytest.param("RNN", torch.float32, {"packed": True}, id="RNN-packed"),
        pytest.param("LSTM", torch.float32, {"packed": True}, id="LSTM-packed"),
        pytest.param("GRU", torch.float64, {"packed": True}, id="GRU-packed-float64"),
        pytest.param("LSTM", torch.float32, {"packed": True, "bidirectional": True, "proj_size": 3}, id="LSTM-packed-bidirectional-proj"),
    ]
)


@pytest.mark.parametrize("kind,dtype,options", RNN_CASES)
def test_every_recurrent_layer_and_cell_trains_one_step_cleanly(kind, dtype, options):
    """One SGD-momentum step of each torch.nn recurrent layer (2 layers, initial state given)
    and cell (unrolled 3 steps), float32 and float64, LSTM with proj_size, bidirectional,
    batch_first, inter-layer dropout, and packed sequences (`pack_padded_sequence(...,
    enforce_sorted=False)` / `pad_packed_sequence`) as in the PyTorch docs' usage."""
    options = dict(options)
    packed = options.pop("packed", False)
    cell = kind.endswith("Cell")
    inp, hid, batch, steps = 4, 6, 3, 5

    def build():
        if cell:
            rnn = getattr(nn, kind)(inp, hid)
            out_features = hid
        else:
            rnn = getattr(nn, kind)(inp, hid, num_layers=2, **options)
            out_features = (options.get("proj_size") or hid) * (2 if options.get("bidirectional") else 1)
        model = nn.ModuleDict({"rnn": rnn, "head": nn.Linear(out_features, 2)}).to(dtype)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def train(objs):
        model, opt = objs
        rnn, head = model["rnn"], model["head"]
        opt.zero_grad()
        x = torch.randn(steps, batch, inp, dtype=dtype)
        if cell:
            state = None
            outs = []
            for t in range(steps):
                state = rnn(x[t], state)
                outs.append(state[0] if kind == "LSTMCell" else state)
            out = torch.stack(outs)
            last = outs[-1]
        else:
            dirs = 2 if options.get("bidirectional") else 1
            h_size = options.get("proj_size") or hid
            h0 = torch.randn(2 * dirs, batch, h_size, dtype=dtype)
            state = (h0, torch.randn(2 * dirs, batch, hid, dtype=dtype)) if kind == "LSTM" else h0
            if options.get("batch_first"):
                x = x.transpose(0, 1).contiguous()
            if packed:
                lengths = torch.tensor([steps, 2, 3])
                seq = nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
                out, state = rnn(seq, state)
                out, _ = nn.utils.rnn.pad_packed_sequence(out)
            else:
                out, state = rnn(x, state)
            last = state[0] if kind == "LSTM" else state
        loss = head(out).pow(2).mean() + last.pow(2).mean()
        loss.backward()
        opt.step()

    twin(build, train, lambda objs: (objs[0],))


# ---------------------------------------------------------------------------
# 13. the idiom scripts under `inplace-doctor run`
# ---------------------------------------------------------------------------

FINDING_LINE = re.compile(r"^(error|warning)\s+IPD\d{3}\b")
SCRIPTS = ["rl_rlkit", "polyak", "ema_timm", "lstmcell_sine", "biggan_distribution"]


@pytest.fixture(scope="module")
def scripts_run() -> subprocess.CompletedProcess[str]:
    """`python -m inplace_doctor run tests/real_code/idioms/run_all.py`: the five idiom scripts, each run as
    `__main__` in turn, in one watched interpreter (one torch import: a few seconds each on a
    loaded 2-core machine instead of five)."""
    return subprocess.run(
        [sys.executable, "-m", "inplace_doctor", "run", str(IDIOMS / "run_all.py"), *SCRIPTS],
        capture_output=True, text=True, timeout=240, cwd=REPO,
        env={**os.environ, "NO_COLOR": "1", "OMP_NUM_THREADS": "1"},
    )


def finding_blocks(stderr: str) -> list[str]:
    """The text of each error/warning finding of a text report (header line up to the blank line)."""
    blocks, current = [], None
    for line in stderr.splitlines():
        if FINDING_LINE.match(line):
            current = [line]
            blocks.append(current)
        elif current is not None:
            if not line.strip():
                current = None
            else:
                current.append(line)
    return ["\n".join(b) for b in blocks]


def test_idiom_scripts_under_inplace_doctor_run_exit_zero(scripts_run):
    """The whole run exits 0 with every script's output, no error/warning finding, no traceback."""
    assert [line[3:] for line in scripts_run.stdout.splitlines() if line.startswith("== ")] == SCRIPTS, scripts_run.stderr[-3000:]
    assert scripts_run.returncode == 0, scripts_run.stderr[-4000:]
    assert not finding_blocks(scripts_run.stderr), scripts_run.stderr[-4000:]
    assert "Traceback" not in scripts_run.stderr, scripts_run.stderr[-4000:]


@pytest.mark.parametrize("script", SCRIPTS)
def test_idiom_script_under_inplace_doctor_run_has_no_finding(scripts_run, script):
    """Per script (rlkit SAC/TD3/DDPG; every soft-update form; timm-style EMA V2 and V3;
    time_sequence_prediction's float64 LSTMCells with L-BFGS; BigGAN's Distribution tensor
    subclass): no error/warning finding of `inplace-doctor run` names a line of it."""
    assert f"== {script}" in scripts_run.stdout, scripts_run.stderr[-3000:]
    mine = [b for b in finding_blocks(scripts_run.stderr) if f"idioms/{script}.py" in b]
    assert not mine, "\n\n".join(mine)
