"""Correct training programs of patterns the other idiom tests do not cover stay silent under both
tracers, and the tool changes nothing they compute.

Each program is run three times from the same seeds: plain, under `watch()` (the fast tracer, the
default) and under `watch(deep=True)`. Its recorded values (losses, predictions), every parameter,
buffer and gradient of its modules and its optimizers' state must be bit-identical in the three
runs; neither watch may make a finding of severity error, and the warnings each makes must be
exactly those the test names (each one true: the test's docstring says why). Tiny models, 2-4
steps, CPU.

These are the adversarial ones: a write to a tensor between a forward and its backward that the
backward does not read (a buffer used only through ops that save nothing, another module's noise,
a codebook whose saving graph backward never reaches), in-place ops on fresh tensors that sit
between graph ops, per-implementation optimizer kernels (for-loop, foreach, fused), parametrizations
that write their state in every forward.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import inplace_doctor as ipd
from inplace_doctor import Severity


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: the three runs agree bit for bit and tiny models do not spin OpenMP."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------------------
# the harness: plain, fast, deep
# ---------------------------------------------------------------------------


def _state(objs: dict[str, Any], recorded: Any) -> dict[str, Any]:
    """Everything the program computed: recorded values, module state and grads, optimizer state."""
    out: dict[str, Any] = {"recorded": recorded}
    for i, m in enumerate(objs["modules"]):
        for name, t in m.state_dict(keep_vars=True).items():
            out[f"m{i}.{name}"] = t.detach().clone()
        for name, p in m.named_parameters():
            out[f"m{i}.{name}.grad"] = None if p.grad is None else p.grad.detach().clone()
    for i, opt in enumerate(objs.get("optimizers", ())):
        for k, st in opt.state_dict()["state"].items():
            for name, v in st.items():
                out[f"opt{i}.{k}.{name}"] = v.detach().clone() if isinstance(v, torch.Tensor) else v
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def _differences(plain: dict[str, Any], other: dict[str, Any]) -> list[str]:
    if plain.keys() != other.keys():
        return [f"keys: {sorted(set(plain) ^ set(other))[:10]}"]
    return [k for k in plain if not _same(plain[k], other[k])]


def _describe(findings: list[Any]) -> str:
    return "\n\n".join(f"{f.code} {f.severity}: {f.message}" for f in findings)


def programs_agree(
    build: Callable[[], dict[str, Any]],
    train: Callable[[dict[str, Any]], Any],
    *,
    warnings: frozenset[str] = frozenset(),
    seed: int = 0,
) -> dict[str, Any]:
    """Run `train(build())` plain, under watch() and under watch(deep=True); see the module docstring.

    `build` returns a dict with "modules" (the modules whose state is compared and which are watched)
    and optionally "optimizers"; `train` returns what the loop recorded. Returns the watch sessions.
    """
    runs: dict[str, dict[str, Any]] = {}
    sessions: dict[str, ipd.watch] = {}
    for mode in ("plain", "fast", "deep"):
        torch.manual_seed(seed)
        objs = build()
        torch.manual_seed(seed + 1)
        if mode == "plain":
            recorded = train(objs)
        else:
            with ipd.watch(*objs["modules"], deep=True if mode == "deep" else None) as session:
                recorded = train(objs)
            sessions[mode] = session
            assert session.deep is (mode == "deep")
            assert session.tracer.writes > 0  # it did trace the program
        runs[mode] = _state(objs, recorded)
    for mode, session in sessions.items():
        differ = _differences(runs["plain"], runs[mode])
        assert not differ, f"watch({mode}) changed what the program computed: {differ[:10]}"
        errors = [f for f in session.findings if f.severity is Severity.ERROR]
        assert not errors, f"watch({mode}):\n" + _describe(errors)
        warned = {f.code for f in session.findings if f.severity is Severity.WARNING}
        assert warned == set(warnings), f"watch({mode}) warned {sorted(warned)}:\n" + _describe(
            [f for f in session.findings if f.severity is Severity.WARNING])
    return sessions


def _mlp(din: int = 6, dh: int = 12, dout: int = 3) -> nn.Sequential:
    return nn.Sequential(nn.Linear(din, dh), nn.ReLU(inplace=True), nn.Dropout(0.1), nn.Linear(dh, dout))


def _steps(objs: dict[str, Any], n: int = 3, scheduler: Any = None) -> list[torch.Tensor]:
    model, opt = objs["modules"][0], objs["optimizers"][0]
    losses = []
    for _ in range(n):
        x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.detach())
    return losses


# ---------------------------------------------------------------------------
# 1. every optimizer in each of its implementations, with lr schedulers
# ---------------------------------------------------------------------------

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "SGD_nesterov": lambda ps, **kw: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3, **kw),
    "Adam_amsgrad": lambda ps, **kw: torch.optim.Adam(ps, lr=1e-2, amsgrad=True, weight_decay=1e-3, **kw),
    "AdamW": lambda ps, **kw: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, **kw),
    "RMSprop_centered": lambda ps, **kw: torch.optim.RMSprop(ps, lr=1e-2, momentum=0.9, centered=True, **kw),
    "Adagrad": lambda ps, **kw: torch.optim.Adagrad(ps, lr=1e-2, lr_decay=1e-3, **kw),
    "Adamax": lambda ps, **kw: torch.optim.Adamax(ps, lr=1e-2, **kw),
    "NAdam_decoupled": lambda ps, **kw: torch.optim.NAdam(ps, lr=1e-2, weight_decay=1e-2, decoupled_weight_decay=True, **kw),
    "RAdam": lambda ps, **kw: torch.optim.RAdam(ps, lr=1e-2, **kw),
    "Adadelta": lambda ps, **kw: torch.optim.Adadelta(ps, lr=1.0, **kw),
    "ASGD": lambda ps, **kw: torch.optim.ASGD(ps, lr=1e-2, t0=1, **kw),
    "Rprop": lambda ps, **kw: torch.optim.Rprop(ps, lr=1e-2, **kw),
}
FUSED_ON_CPU = {"SGD_nesterov", "Adam_amsgrad", "AdamW", "Adagrad"}
CASES = [(name, impl) for name in OPTIMIZERS for impl in ("for_loop", "foreach", "fused")
         if impl != "fused" or name in FUSED_ON_CPU]


@pytest.mark.parametrize(("name", "impl"), CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_every_optimizer_in_every_implementation_is_silent_and_unchanged(name, impl):
    """Each torch.optim optimizer with its for-loop, `_foreach_*` and (where the CPU has one) fused
    kernel: 3 steps of an MLP with an in-place ReLU, the step's in-place writes to parameters and
    state coming after each backward. The optimizer state (exp_avg, momentum buffers, step counts)
    is compared too."""
    kw = {"foreach": False} if impl == "for_loop" else {"foreach": True} if impl == "foreach" else {"fused": True}

    def build():
        model = _mlp()
        return {"modules": [model], "optimizers": [OPTIMIZERS[name](model.parameters(), **kw)]}

    programs_agree(build, _steps)


SCHEDULERS: dict[str, Callable[[torch.optim.Optimizer], Any]] = {
    "OneCycleLR": lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=6),
    "CosineAnnealingWarmRestarts": lambda opt: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=2),
    "warmup_then_cosine": lambda opt: torch.optim.lr_scheduler.SequentialLR(opt, [
        torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=2),
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4)], milestones=[2]),
    "CyclicLR": lambda opt: torch.optim.lr_scheduler.CyclicLR(opt, base_lr=0.01, max_lr=0.1, step_size_up=2),
    "LambdaLR": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.9 ** step),
}


@pytest.mark.parametrize("sched", list(SCHEDULERS))
@pytest.mark.parametrize("opt_name", ["SGD_nesterov", "AdamW"])
def test_lr_schedulers_stepped_every_batch_are_silent(sched, opt_name):
    """Schedulers stepped after every `optimizer.step()` (OneCycleLR also cycles the momentum /
    beta1 it writes into `param_groups`), then ReduceLROnPlateau fed the last loss."""
    if sched == "CyclicLR" and opt_name == "AdamW":
        pytest.skip("CyclicLR cycles `momentum`, which AdamW has not")

    def build():
        model = _mlp()
        return {"modules": [model], "optimizers": [OPTIMIZERS[opt_name](model.parameters())]}

    def train(objs):
        opt = objs["optimizers"][0]
        losses = _steps(objs, n=4, scheduler=SCHEDULERS[sched](opt))
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0)
        losses += _steps(objs, n=2)
        plateau.step(losses[-1])
        return losses + [opt.param_groups[0]["lr"]]

    programs_agree(build, train)


@pytest.mark.parametrize("foreach", [False, True])
def test_two_stage_clipping_with_total_norm_of_several_models_is_silent(foreach):
    """`clip_grad_norm_` with norm_type inf and 1 and error_if_nonfinite, and the two-stage form
    (`get_total_norm` of the grads of two models, then `clip_grads_with_norm_` on each), as
    torchtitan does across pipeline stages; Adam's step after each."""
    utils = nn.utils

    def build():
        a, b = _mlp(), nn.Linear(3, 3)
        return {"modules": [a, b], "optimizers": [torch.optim.Adam([*a.parameters(), *b.parameters()], lr=1e-2, foreach=foreach)]}

    def train(objs):
        (a, b), opt = objs["modules"], objs["optimizers"][0]
        norms = []
        for norm_type in (float("inf"), 1.0, 2.0):
            opt.zero_grad()
            x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
            F.cross_entropy(b(a(x)), y).backward()
            if norm_type == 2.0:
                grads = [p.grad for p in [*a.parameters(), *b.parameters()]]
                total = utils.get_total_norm(grads, foreach=foreach)
                utils.clip_grads_with_norm_(a.parameters(), 0.1, total, foreach=foreach)
                utils.clip_grads_with_norm_(b.parameters(), 0.1, total, foreach=foreach)
            else:
                total = utils.clip_grad_norm_([*a.parameters(), *b.parameters()], 0.1, norm_type=norm_type,
                                              error_if_nonfinite=True, foreach=foreach)
            norms.append(total)
            opt.step()
        return norms

    programs_agree(build, train)


# ---------------------------------------------------------------------------
# 2. writes between a forward and its backward that the backward does not read
# ---------------------------------------------------------------------------


class RunningNorm(nn.Module):
    """A running-statistics normalizer of hidden features (RL observation/feature normalizers):
    it normalizes with the running mean and std, then updates them in place under no_grad in the
    same forward. `h - mean` saves nothing and the divisor `sqrt(var + eps)` is a fresh tensor, so
    the update after the use is correct."""

    def __init__(self, dim: int, momentum: float = 0.1):
        super().__init__()
        self.momentum = momentum
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    def forward(self, h):
        out = (h - self.mean) / torch.sqrt(self.var + 1e-5)
        if self.training:
            with torch.no_grad():
                d = h.detach()
                self.mean.mul_(1 - self.momentum).add_(d.mean(0), alpha=self.momentum)
                self.var.mul_(1 - self.momentum).add_(d.var(0), alpha=self.momentum)
                self.count += 1
        return out


def test_buffer_updated_in_forward_after_ops_that_save_nothing_of_it_is_silent():
    """RunningNorm between two Linear layers: the buffers are read, then overwritten in place
    before backward, but no op saved them; then an eval pass on the running statistics."""

    def build():
        model = nn.Sequential(nn.Linear(6, 8), RunningNorm(8), nn.ReLU(inplace=True), nn.Linear(8, 3))
        return {"modules": [model], "optimizers": [torch.optim.SGD(model.parameters(), lr=0.1)]}

    def train(objs):
        losses = _steps(objs, n=3)
        model = objs["modules"][0].eval()
        with torch.no_grad():
            return losses + [model(torch.randn(2, 6))]

    programs_agree(build, train)


class NoisyLinear(nn.Module):
    """Kaixhin/Rainbow model.py NoisyLinear (factorised Gaussian noise in buffers)."""

    def __init__(self, in_features: int, out_features: int, std_init: float = 0.5):
        super().__init__()
        self.in_features, self.out_features, self.std_init = in_features, out_features, std_init
        self.weight_mu = nn.Parameter(torch.empty(out_features, in_features))
        self.weight_sigma = nn.Parameter(torch.empty(out_features, in_features))
        self.register_buffer("weight_epsilon", torch.empty(out_features, in_features))
        self.bias_mu = nn.Parameter(torch.empty(out_features))
        self.bias_sigma = nn.Parameter(torch.empty(out_features))
        self.register_buffer("bias_epsilon", torch.empty(out_features))
        mu_range = 1 / math.sqrt(self.in_features)
        self.weight_mu.data.uniform_(-mu_range, mu_range)
        self.weight_sigma.data.fill_(self.std_init / math.sqrt(self.in_features))
        self.bias_mu.data.uniform_(-mu_range, mu_range)
        self.bias_sigma.data.fill_(self.std_init / math.sqrt(self.out_features))
        self.reset_noise()

    def _scale_noise(self, size: int) -> torch.Tensor:
        x = torch.randn(size)
        return x.sign().mul_(x.abs().sqrt_())

    def reset_noise(self) -> None:
        epsilon_in = self._scale_noise(self.in_features)
        epsilon_out = self._scale_noise(self.out_features)
        self.weight_epsilon.copy_(epsilon_out.ger(epsilon_in))
        self.bias_epsilon.copy_(epsilon_out)

    def forward(self, input):
        if self.training:
            return F.linear(input, self.weight_mu + self.weight_sigma * self.weight_epsilon,
                            self.bias_mu + self.bias_sigma * self.bias_epsilon)
        return F.linear(input, self.weight_mu, self.bias_mu)


class NoisyDQN(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 16)
        self.fc_h, self.fc_z = NoisyLinear(16, 16), NoisyLinear(16, 3)

    def forward(self, x):
        return self.fc_z(F.relu(self.fc_h(F.relu(self.fc(x)))))

    def reset_noise(self) -> None:
        self.fc_h.reset_noise()
        self.fc_z.reset_noise()


def test_noisy_nets_target_noise_resampled_between_the_online_forward_and_its_backward_is_silent():
    """Kaixhin/Rainbow agent.py `learn`: the online net's forward (its `weight_sigma * weight_epsilon`
    saved the online noise), then `self.target_net.reset_noise()` writes the *target* net's noise
    buffers in place before the target's no_grad forward, then the online backward; `reset_noise()`
    of the online net every step after the update; `update_target_net` by load_state_dict."""

    def build():
        online, target = NoisyDQN(), NoisyDQN()
        target.load_state_dict(online.state_dict())
        for p in target.parameters():
            p.requires_grad_(False)
        return {"modules": [online, target], "optimizers": [torch.optim.Adam(online.parameters(), lr=1e-3, eps=1.5e-4)]}

    def train(objs):
        (online, target), opt = objs["modules"], objs["optimizers"][0]
        losses = []
        for step in range(4):
            s, a, r, s2 = torch.randn(5, 4), torch.randint(0, 3, (5,)), torch.randn(5), torch.randn(5, 4)
            q = online(s).gather(1, a.unsqueeze(1)).squeeze(1)
            with torch.no_grad():
                a2 = online(s2).argmax(1)
                target.reset_noise()
                q2 = target(s2).gather(1, a2.unsqueeze(1)).squeeze(1)
            loss = F.smooth_l1_loss(q, r + 0.99 * q2)
            online.zero_grad()
            loss.backward()
            opt.step()
            online.reset_noise()
            if step % 2 == 1:
                target.load_state_dict(online.state_dict())
            losses.append(loss.detach())
        return losses

    programs_agree(build, train)


class VQEMA(nn.Module):
    """rosinality/vq-vae-2-pytorch vqvae.py `Quantize`: the codebook is a buffer updated by EMA in
    the forward (`self.embed.data.copy_(embed_normalized)`, `cluster_size` and `embed_avg` through
    `.data.mul_().add_()`), after `flatten @ self.embed` saved it in a graph that the loss never
    reaches (the distances only pick the argmin; the straight-through estimator detaches)."""

    def __init__(self, dim: int, n_embed: int, through: str, decay: float = 0.9, eps: float = 1e-5):
        super().__init__()
        self.dim, self.n_embed, self.decay, self.eps, self.through = dim, n_embed, decay, eps, through
        embed = torch.randn(dim, n_embed)
        self.register_buffer("embed", embed)
        self.register_buffer("cluster_size", torch.zeros(n_embed))
        self.register_buffer("embed_avg", embed.clone())

    def forward(self, input):
        flatten = input.reshape(-1, self.dim)
        dist = flatten.pow(2).sum(1, keepdim=True) - 2 * flatten @ self.embed + self.embed.pow(2).sum(0, keepdim=True)
        _, embed_ind = (-dist).max(1)
        embed_onehot = F.one_hot(embed_ind, self.n_embed).type(flatten.dtype)
        embed_ind = embed_ind.view(*input.shape[:-1])
        quantize = F.embedding(embed_ind, self.embed.transpose(0, 1))
        if self.training:
            embed_onehot_sum = embed_onehot.sum(0)
            embed_sum = flatten.transpose(0, 1) @ embed_onehot
            if self.through == "data":
                self.cluster_size.data.mul_(self.decay).add_(embed_onehot_sum, alpha=1 - self.decay)
                self.embed_avg.data.mul_(self.decay).add_(embed_sum, alpha=1 - self.decay)
            else:
                with torch.no_grad():
                    self.cluster_size.mul_(self.decay).add_(embed_onehot_sum, alpha=1 - self.decay)
                    self.embed_avg.mul_(self.decay).add_(embed_sum, alpha=1 - self.decay)
            n = self.cluster_size.sum()
            cluster_size = (self.cluster_size + self.eps) / (n + self.n_embed * self.eps) * n
            embed_normalized = self.embed_avg / cluster_size.unsqueeze(0)
            if self.through == "data":
                self.embed.data.copy_(embed_normalized)
            else:
                with torch.no_grad():
                    self.embed.copy_(embed_normalized)
        diff = (quantize.detach() - input).pow(2).mean()
        quantize = input + (quantize - input).detach()
        return quantize, diff


@pytest.mark.parametrize("through", ["data", "no_grad"])
def test_vq_vae_ema_codebook_written_in_forward_after_an_unreached_save_is_silent(through):
    """The rosinality Quantize between an encoder and a decoder, trained with the reconstruction
    loss plus 0.25 * the commitment `diff`, as train_vqvae.py does. The codebook saved by the
    distance matmul is overwritten before backward (through `.data`, or in place under no_grad
    which bumps its version), but that saving node is not on any path from the loss: backward
    never unpacks it and plain PyTorch is silent (checked by the plain run)."""

    def build():
        model = nn.ModuleDict({"enc": nn.Linear(6, 4), "vq": VQEMA(4, 5, through), "dec": nn.Linear(4, 6)})
        return {"modules": [model], "optimizers": [torch.optim.Adam(model.parameters(), lr=1e-2)]}

    def train(objs):
        model, opt = objs["modules"][0], objs["optimizers"][0]
        losses = []
        for _ in range(3):
            x = torch.randn(2, 5, 6)
            quant, diff = model["vq"](model["enc"](x))
            loss = F.mse_loss(model["dec"](quant), x) + 0.25 * diff
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return losses

    programs_agree(build, train)


def test_two_views_through_one_batchnorm_encoder_then_one_backward_is_silent():
    """SimCLR/Siamese: both augmented views go through the same BatchNorm encoder in training mode
    (its running statistics are written by each forward) and one NT-Xent-style loss is backpropagated
    through both graphs; BatchNorm's backward in training mode reads the batch statistics it saved,
    not the running ones."""

    def build():
        enc = nn.Sequential(nn.Linear(6, 12), nn.BatchNorm1d(12), nn.ReLU(inplace=True), nn.Linear(12, 4))
        return {"modules": [enc], "optimizers": [torch.optim.SGD(enc.parameters(), lr=0.1, momentum=0.9)]}

    def train(objs):
        enc, opt = objs["modules"][0], objs["optimizers"][0]
        losses = []
        for _ in range(3):
            x = torch.randn(6, 6)
            z1 = F.normalize(enc(x + 0.1 * torch.randn_like(x)), dim=1)
            z2 = F.normalize(enc(x * (1 + 0.1 * torch.randn_like(x))), dim=1)
            z = torch.cat([z1, z2])
            sim = z @ z.T / 0.5
            sim.fill_diagonal_(float("-inf"))
            target = torch.cat([torch.arange(6, 12), torch.arange(6)])
            loss = F.cross_entropy(sim, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return losses

    programs_agree(build, train)


# ---------------------------------------------------------------------------
# 3. in-place ops on fresh tensors between graph ops
# ---------------------------------------------------------------------------


class MaskedAttention(nn.Module):
    """Hand-written causal attention: `scores.masked_fill_(mask, -inf)` on the fresh scores (the
    matmul saved q and k, the scaling saved nothing), softmax, in-place dropout on the attention
    weights' copy, `out += residual`."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x, pad):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))
        t = x.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).triu_(1)
        scores.masked_fill_(causal, float("-inf"))
        scores.masked_fill_(pad[:, None, :], -1e9)
        att = F.dropout(F.softmax(scores, dim=-1), 0.1, training=self.training)
        out = self.proj(att @ v)
        out += x
        return out


def test_masked_fill_on_fresh_attention_scores_is_silent():
    def build():
        model = nn.ModuleDict({"emb": nn.Embedding(10, 8), "att": MaskedAttention(), "head": nn.Linear(8, 10)})
        return {"modules": [model], "optimizers": [torch.optim.AdamW(model.parameters(), lr=1e-2)]}

    def train(objs):
        model, opt = objs["modules"][0], objs["optimizers"][0]
        losses = []
        for _ in range(3):
            idx = torch.randint(0, 10, (2, 5))
            pad = torch.zeros(2, 5, dtype=torch.bool)
            pad[1, 3:] = True
            logits = model["head"](model["att"](model["emb"](idx), pad))
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, 10), idx[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return losses

    programs_agree(build, train)


class MessagePassing(nn.Module):
    """A GNN layer as PyG's `scatter(..., reduce="sum"/"mean")` does it by hand: messages
    `index_add_`ed / `scatter_add_`ed into fresh zero buffers, degrees by `index_add_` of ones,
    an `index_put_(accumulate=True)` readout, then an in-place ReLU."""

    def __init__(self, d: int, how: str):
        super().__init__()
        self.how = how
        self.lin, self.root = nn.Linear(d, d), nn.Linear(d, d, bias=False)

    def forward(self, x, edge_index):
        src, dst = edge_index
        msg = self.lin(x)[src]
        if self.how == "index_add_":
            agg = torch.zeros_like(x).index_add_(0, dst, msg)
        elif self.how == "scatter_add_":
            agg = x.new_zeros(x.shape).scatter_add_(0, dst[:, None].expand_as(msg), msg)
        else:
            agg = x.new_zeros(x.shape).index_put_((dst,), msg, accumulate=True)
        deg = torch.zeros(x.shape[0]).index_add_(0, dst, torch.ones(dst.shape[0])).clamp_(min=1)
        agg /= deg[:, None]
        return F.relu_(agg + self.root(x))


@pytest.mark.parametrize("how", ["index_add_", "scatter_add_", "index_put_"])
def test_message_passing_into_fresh_buffers_is_silent(how):
    def build():
        model = nn.ModuleList([MessagePassing(6, how), MessagePassing(6, how), nn.Linear(6, 2)])
        return {"modules": [model], "optimizers": [torch.optim.Adam(model.parameters(), lr=1e-2)]}

    def train(objs):
        model, opt = objs["modules"][0], objs["optimizers"][0]
        edge_index = torch.tensor([[0, 1, 2, 3, 4, 0, 2], [1, 2, 3, 4, 0, 3, 0]])
        losses = []
        for _ in range(3):
            x, batch = torch.randn(5, 6), torch.tensor([0, 0, 0, 1, 1])
            h = model[1](model[0](x, edge_index), edge_index)
            pooled = torch.zeros(2, 6).index_add_(0, batch, h)  # global add pool
            loss = F.cross_entropy(model[2](pooled), torch.tensor([0, 1]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return losses

    programs_agree(build, train)


class Seq2Seq(nn.Module):
    """bentrevett/pytorch-seq2seq: `outputs = torch.zeros(trg_len, batch, vocab)` filled step by
    step with `outputs[t] = output` (CopySlices into a fresh buffer), teacher forcing by coin flip,
    the next input `trg[t] if teacher_force else top1`."""

    def __init__(self, vocab: int = 7, hid: int = 8):
        super().__init__()
        self.vocab = vocab
        self.enc_emb, self.dec_emb = nn.Embedding(vocab, hid), nn.Embedding(vocab, hid)
        self.encoder, self.decoder = nn.GRU(hid, hid), nn.GRUCell(hid, hid)
        self.fc_out = nn.Linear(hid, vocab)

    def forward(self, src, trg, teacher_forcing_ratio: float = 0.5):
        trg_len, batch_size = trg.shape
        outputs = torch.zeros(trg_len, batch_size, self.vocab)
        _, hidden = self.encoder(F.dropout(self.enc_emb(src), 0.1, self.training))
        hidden = hidden[0]
        input = trg[0, :]
        for t in range(1, trg_len):
            hidden = self.decoder(self.dec_emb(input), hidden)
            output = self.fc_out(hidden)
            outputs[t] = output
            teacher_force = torch.rand(()) < teacher_forcing_ratio
            top1 = output.argmax(1)
            input = trg[t] if teacher_force else top1
        return outputs


def test_seq2seq_outputs_written_step_by_step_into_a_fresh_buffer_is_silent():
    def build():
        model = Seq2Seq()
        return {"modules": [model], "optimizers": [torch.optim.Adam(model.parameters(), lr=1e-2)]}

    def train(objs):
        model, opt = objs["modules"][0], objs["optimizers"][0]
        losses = []
        for _ in range(3):
            src, trg = torch.randint(0, 7, (5, 2)), torch.randint(0, 7, (4, 2))
            opt.zero_grad()
            output = model(src, trg)
            loss = F.cross_entropy(output[1:].reshape(-1, 7), trg[1:].reshape(-1))
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.detach())
        return losses

    programs_agree(build, train)


def test_packed_bidirectional_lstm_and_hard_gumbel_softmax_are_silent():
    """A bidirectional 2-layer LSTM with inter-layer dropout over `pack_padded_sequence`, its
    `pad_packed_sequence` output pooled; then a hard Gumbel-softmax (straight-through: the one-hot
    is `zeros_like(logits).scatter_(...)`, a fresh tensor) picking one of 3 codes."""

    def build():
        model = nn.ModuleDict({"emb": nn.Embedding(9, 6), "rnn": nn.LSTM(6, 5, num_layers=2, dropout=0.2,
                                                                          bidirectional=True),
                               "logits": nn.Linear(10, 3), "codes": nn.Linear(3, 2)})
        return {"modules": [model], "optimizers": [torch.optim.RMSprop(model.parameters(), lr=1e-2)]}

    def train(objs):
        model, opt = objs["modules"][0], objs["optimizers"][0]
        losses = []
        for _ in range(3):
            lengths = torch.tensor([5, 3, 2])
            x = model["emb"](torch.randint(1, 9, (5, 3)))
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths)
            out, _ = model["rnn"](packed)
            out, _ = nn.utils.rnn.pad_packed_sequence(out)
            pooled = out.sum(0) / lengths[:, None]
            code = F.gumbel_softmax(model["logits"](pooled), tau=0.5, hard=True)
            loss = F.cross_entropy(model["codes"](code), torch.tensor([0, 1, 1]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return losses

    programs_agree(build, train)


class Tagger(nn.Module):
    """A token tagger whose forward writes in place (`h += self.pos`, an in-place ReLU) before its
    attention layers: the fast tracer's function mode is on the stack from that write."""

    def __init__(self, norm_first: bool):
        super().__init__()
        self.emb, self.pos = nn.Linear(8, 8), nn.Parameter(torch.randn(5, 8))
        layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.1, activation="gelu",
                                           batch_first=True, norm_first=norm_first)
        self.enc = nn.TransformerEncoder(layer, 2)  # enable_nested_tensor: padded batches nested in eval
        self.dec = nn.TransformerDecoderLayer(8, 2, 16, 0.1, batch_first=True, norm_first=norm_first)
        self.pool = nn.MultiheadAttention(8, 2, dropout=0.1, batch_first=True)
        self.query = nn.Parameter(torch.randn(1, 1, 8))
        self.head = nn.Linear(8, 3)

    def forward(self, x, pad, causal=None):
        h = self.emb(x)
        h += self.pos
        h = F.relu(h, inplace=True)
        h = self.pool(h, h, h, key_padding_mask=pad, need_weights=False)[0]  # self-attention
        mem = self.enc(h, src_key_padding_mask=pad) if causal is None else self.enc(
            h, mask=causal, src_key_padding_mask=pad, is_causal=True)
        y = self.dec(h, mem, tgt_mask=causal, tgt_is_causal=causal is not None, memory_key_padding_mask=pad)
        pooled, weights = self.pool(self.query.expand(x.shape[0], -1, -1), y, y, key_padding_mask=pad,
                                    average_attn_weights=False)
        return self.head(pooled[:, 0]), weights, mem


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_layers_train_then_evaluate_on_torchs_fused_paths_bit_identically(norm_first):
    """nn.TransformerEncoder (2 layers, dropout 0.1, GELU, batch_first) with a causal mask and a key
    padding mask, a TransformerDecoderLayer over its memory and nn.MultiheadAttention for
    self-attention and for a pooling query returning per-head weights; AdamW + warmup. Then eval
    under no_grad, where PyTorch takes its fused paths (`_native_multi_head_attention`,
    `_transformer_encoder_layer_fwd`, the padded batch as a nested tensor, whose padded positions
    come out as zeros) only when no TorchFunctionMode is on the stack: the tracers' function mode
    (always on in deep mode; on in the fast one after `h += self.pos`) must not turn them off."""

    def build():
        model = Tagger(norm_first)
        return {"modules": [model], "optimizers": [torch.optim.AdamW(model.parameters(), lr=1e-2)]}

    def train(objs):
        model, opt = objs["modules"][0], objs["optimizers"][0]
        sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=2)
        pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
        causal = nn.Transformer.generate_square_subsequent_mask(5)
        losses = []
        for _ in range(2):
            x, y = torch.randn(2, 5, 8), torch.randint(0, 3, (2,))
            logits, weights, _ = model(x, pad, causal)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            losses += [loss.detach(), weights.detach()]
        model.eval()
        with torch.no_grad():
            losses += list(model(torch.randn(2, 5, 8), pad))
        return losses

    programs_agree(build, train)


@pytest.mark.parametrize("deep", [
    False,
    pytest.param(True, marks=pytest.mark.xfail(strict=True, reason=(
        "the deep tracer's always-on TorchDispatchMode changes which kernels composite ops take in "
        "inference mode: F.linear of a non-contiguous 3-D input with a weight that requires grad "
        "(MultiheadAttention's in-projection) gives other bits under any Python dispatch mode"))),
])
def test_inference_mode_evaluation_of_attention_is_bit_identical(deep):
    """`torch.inference_mode()` evaluation of nn.MultiheadAttention with a float causal mask (its
    composite path) and of a padded batch through nn.TransformerEncoder, after a training step."""
    torch.manual_seed(0)
    model = Tagger(norm_first=False).eval()
    x, pad = torch.randn(2, 5, 8), torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    with torch.inference_mode():
        plain = [model(x, pad, causal), model(x, pad)]
    with ipd.watch(model, deep=deep) as session, torch.inference_mode():
        watched = [model(x, pad, causal), model(x, pad)]
    assert not session.findings
    assert _same(plain, watched)


@pytest.mark.parametrize("deep", [False, True])
def test_a_fused_path_module_that_raises_leaves_the_function_mode_where_it_was(deep):
    """MultiheadAttention raising in eval mode (a query of the wrong width) while the tracer's
    function mode is lifted for it: the mode is back at its place, and a later in-place call that
    changes what a residual reads is still found (IPD105)."""
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    with ipd.watch(mha, deep=deep) as session:
        h = torch.randn(2, 3, 8)
        h += 1  # the fast tracer's mode on from here
        depth = torch._C._len_torch_function_stack()
        assert depth == 1  # the tracer's mode is on the stack
        with torch.no_grad(), pytest.raises(AssertionError):
            mha(torch.randn(2, 3, 6), torch.randn(2, 3, 6), torch.randn(2, 3, 6))
        assert torch._C._len_torch_function_stack() == depth
        x = torch.randn(4, requires_grad=True) * 2
        y = F.relu(x, inplace=True)
        (x + y).sum().backward()
    assert any(f.code == "IPD105" for f in session.findings), _describe(session.findings)


@pytest.mark.parametrize("deep", [False, True])
def test_attention_modules_scripted_inside_a_watch_compile_from_torchs_source(deep):
    """`torch.jit.script` of MultiheadAttention, TransformerEncoderLayer and TransformerEncoder while
    a session runs (their `forward` runs the tool's entry code then): TorchScript reads torch's
    source and globals, and the scripted modules compute what the eager ones do."""
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    modules = [nn.MultiheadAttention(8, 2, batch_first=True), layer, nn.TransformerEncoder(layer, 2)]
    x = torch.randn(2, 3, 8)
    with ipd.watch(deep=deep), torch.no_grad():
        for m in modules:
            scripted = torch.jit.script(m.eval())
            args = (x, x, x) if isinstance(m, nn.MultiheadAttention) else (x,)
            assert _same(scripted(*args), m(*args))


@pytest.mark.parametrize("deep", [False, True])
def test_a_stale_tensor_read_by_attention_on_its_fused_path_is_still_found(deep):
    """The hazard beside the correct programs: `r = h` then `h = F.relu(h, inplace=True)`, and
    self-attention over `r` in eval mode under no_grad (the fused path, run with the function mode
    lifted): out of place, `r` would hold the values before the ReLU. IPD105 in both tracers."""

    class StaleRead(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.mha = nn.Linear(8, 8), nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            h = self.lin(x)
            r = h
            h = F.relu(h, inplace=True)
            return self.mha(r, r, r, need_weights=False)[0] + h

    model = StaleRead().eval()
    with torch.no_grad(), ipd.watch(model, deep=deep) as session:
        model(torch.randn(2, 5, 8))
    assert [f.code for f in session.findings if f.severity is Severity.ERROR] == ["IPD105"], _describe(session.findings)


# ---------------------------------------------------------------------------
# 4. weights written between steps: LoRA merges, tying, EMA teachers, frozen stages
# ---------------------------------------------------------------------------


class LoRALinear(nn.Module):
    """A frozen base weight plus a trainable low-rank update (peft's `lora.Linear`, ReLoRA)."""

    def __init__(self, d_in: int, d_out: int, r: int = 2, alpha: float = 4.0):
        super().__init__()
        self.base = nn.Linear(d_in, d_out)
        self.base.weight.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.randn(r, d_in) * 0.1)
        self.lora_B = nn.Parameter(torch.zeros(d_out, r))
        self.scaling = alpha / r
        self.merged = False

    def forward(self, x):
        out = self.base(x)
        if not self.merged:
            out = out + (x @ self.lora_A.T @ self.lora_B.T) * self.scaling
        return out

    @torch.no_grad()
    def merge(self, through: str) -> None:
        delta = self.lora_B @ self.lora_A * self.scaling
        if through == "data":
            self.base.weight.data += delta
        else:
            self.base.weight.add_(delta)
        self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        self.base.weight.sub_(self.lora_B @ self.lora_A * self.scaling)
        self.merged = False

    @torch.no_grad()
    def restart(self) -> None:
        """ReLoRA: after a merge, a fresh low-rank pair."""
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_B.zero_()
        self.merged = False


@pytest.mark.parametrize("through", ["data", "no_grad"])
def test_lora_merge_unmerge_for_evaluation_and_relora_restarts_are_silent(through):
    """peft's `merge_adapter()` before an evaluation and `unmerge_adapter()` after it, between
    training steps; then a ReLoRA restart: merge `W += B @ A * s` (through `.data`, or in place
    under no_grad), fresh A and B, the optimizer state of A and B reset."""

    def build():
        model = nn.Sequential(LoRALinear(6, 8), nn.ReLU(inplace=True), LoRALinear(8, 3))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        return {"modules": [model], "optimizers": [opt]}

    def train(objs):
        model, opt = objs["modules"][0], objs["optimizers"][0]
        loras = [m for m in model if isinstance(m, LoRALinear)]
        out = []
        for step in range(4):
            out += _steps(objs, n=1)
            if step == 1:
                model.eval()
                for m in loras:
                    m.merge(through)
                with torch.no_grad():
                    out.append(model(torch.randn(3, 6)))
                for m in loras:
                    m.unmerge()
                model.train()
            if step == 2:
                for m in loras:
                    m.merge(through)
                    m.restart()
                    for p in (m.lora_A, m.lora_B):
                        opt.state.pop(p, None)
        return out

    programs_agree(build, train)


class TiedLM(nn.Module):
    """A tiny language model with the output layer tied to the embedding (`self.head.weight =
    self.emb.weight`), the embedding scaled in place by sqrt(d) (`h.mul_(...)`: the embedding
    saves only its indices), a learned position table added in place, and a LayerNorm."""

    def __init__(self, vocab: int = 11, d: int = 8):
        super().__init__()
        self.d = d
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(6, d))
        self.mix = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx):
        h = self.emb(idx)
        h.mul_(math.sqrt(self.d))
        h += self.pos[: idx.shape[1]]
        h = h + F.gelu(self.mix(h))
        return self.head(self.norm(h))


def test_tied_embedding_and_output_layer_with_in_place_embedding_scaling_is_silent():
    def build():
        model = TiedLM()
        return {"modules": [model], "optimizers": [torch.optim.Adam(model.parameters(), lr=1e-2)]}

    def train(objs):
        model, opt = objs["modules"][0], objs["optimizers"][0]
        losses = []
        for _ in range(3):
            idx = torch.randint(0, 11, (2, 6))
            logits = model(idx)
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, 11), idx[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.detach())
        assert model.head.weight is model.emb.weight
        return losses

    programs_agree(build, train)


@pytest.mark.parametrize("update", ["lerp_", "foreach_mul_add", "mul_add_through_data"])
def test_mean_teacher_ema_used_as_teacher_before_the_students_backward_is_silent(update):
    """Mean Teacher (CuriousAI/mean-teacher): the EMA teacher's prediction under no_grad is the
    consistency target, computed after the student's forward and before its backward; the teacher
    is updated after the step (`ema_p.lerp_(p, 1 - alpha)`, `torch._foreach_mul_` then
    `torch._foreach_add_`, or `ema_param.data.mul_(alpha).add_(param.data, alpha=1 - alpha)` as
    the original code does), its BatchNorm buffers copied."""

    def net():
        return nn.Sequential(nn.Linear(6, 12), nn.BatchNorm1d(12), nn.ReLU(inplace=True), nn.Dropout(0.2), nn.Linear(12, 3))

    def build():
        student, teacher = net(), net()
        teacher.load_state_dict(student.state_dict())
        for p in teacher.parameters():
            p.requires_grad_(False)
        return {"modules": [student, teacher], "optimizers": [torch.optim.SGD(student.parameters(), lr=0.1, momentum=0.9, nesterov=True)]}

    def train(objs):
        (student, teacher), opt = objs["modules"], objs["optimizers"][0]
        alpha, losses = 0.9, []
        for _ in range(3):
            x, y = torch.randn(6, 6), torch.randint(0, 3, (6,))
            logits = student(x + 0.1 * torch.randn_like(x))
            with torch.no_grad():
                target = F.softmax(teacher(x + 0.1 * torch.randn_like(x)), dim=1)
            loss = F.cross_entropy(logits[:3], y[:3]) + F.mse_loss(F.softmax(logits, dim=1), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                ema, live = list(teacher.parameters()), list(student.parameters())
                if update == "lerp_":
                    for e, p in zip(ema, live):
                        e.lerp_(p, 1 - alpha)
                elif update == "foreach_mul_add":
                    torch._foreach_mul_(ema, alpha)
                    torch._foreach_add_(ema, live, alpha=1 - alpha)
                for eb, b in zip(teacher.buffers(), student.buffers()):
                    eb.copy_(b)
            if update == "mul_add_through_data":
                for e, p in zip(ema, live):
                    e.data.mul_(alpha).add_(p.data, alpha=1 - alpha)
            losses.append(loss.detach())
        return losses

    programs_agree(build, train)


def test_freezing_a_stage_restoring_the_best_state_and_unfreezing_is_silent():
    """Fine-tuning: the backbone frozen with `requires_grad_(False)` for the first steps (its
    BatchNorm in eval mode), unfrozen with a param group added to the optimizer; the best state
    kept with `copy.deepcopy(model.state_dict())` and restored by `load_state_dict` at the end."""
    import copy

    def build():
        model = nn.ModuleDict({"backbone": nn.Sequential(nn.Linear(6, 12), nn.BatchNorm1d(12), nn.ReLU(inplace=True)),
                               "head": nn.Linear(12, 3)})
        return {"modules": [model], "optimizers": [torch.optim.Adam(model["head"].parameters(), lr=1e-2)]}

    def train(objs):
        model, opt = objs["modules"][0], objs["optimizers"][0]
        model["backbone"].requires_grad_(False)
        best, best_loss, losses = None, float("inf"), []
        for step in range(4):
            if step == 2:
                model["backbone"].requires_grad_(True)
                opt.add_param_group({"params": model["backbone"].parameters(), "lr": 1e-3})
            model.train()
            if step < 2:
                model["backbone"].eval()
            x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
            loss = F.cross_entropy(model["head"](model["backbone"](x)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
            if loss.item() < best_loss:
                best, best_loss = copy.deepcopy(model.state_dict()), loss.item()
        model.load_state_dict(best)
        return losses

    programs_agree(build, train)


# ---------------------------------------------------------------------------
# 5. GAN, RL, meta-learning, checkpointing
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["hook_spectral_norm", "parametrized_spectral_norm"])
def test_sngan_hinge_loss_with_real_and_fake_in_one_backward_is_silent(norm):
    """SNGAN: a discriminator under spectral norm (the old hook API `nn.utils.spectral_norm`, and
    `nn.utils.parametrizations.spectral_norm`), whose every training forward runs a power
    iteration writing `u` and `v` in place; D(real) and D(G(z).detach()) go into one hinge loss
    and one backward (the second forward rewrote `u` after the first one used it: both clone what
    they use). Then G's step through D, with in-place LeakyReLU in D and in-place ReLU in G."""
    sn = nn.utils.spectral_norm if norm == "hook_spectral_norm" else nn.utils.parametrizations.spectral_norm

    def build():
        G = nn.Sequential(nn.Linear(4, 12), nn.BatchNorm1d(12), nn.ReLU(inplace=True), nn.Linear(12, 6), nn.Tanh())
        D = nn.Sequential(sn(nn.Linear(6, 12)), nn.LeakyReLU(0.1, inplace=True), sn(nn.Linear(12, 1)))
        return {"modules": [G, D], "optimizers": [torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.0, 0.9)),
                                                  torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.0, 0.9))]}

    def train(objs):
        (G, D), (opt_g, opt_d) = objs["modules"], objs["optimizers"]
        losses = []
        for _ in range(2):
            real, z = torch.randn(5, 6), torch.randn(5, 4)
            fake = G(z)
            loss_d = F.relu(1.0 - D(real)).mean() + F.relu(1.0 + D(fake.detach())).mean()
            opt_d.zero_grad()
            loss_d.backward()
            opt_d.step()
            loss_g = -D(fake).mean()
            opt_g.zero_grad()
            loss_g.backward()
            opt_g.step()
            losses += [loss_d.detach(), loss_g.detach()]
        return losses

    programs_agree(build, train)


class Policy(nn.Module):
    """pytorch/examples reinforcement_learning/reinforce.py's Policy (dropout 0.6, ReLU)."""

    def __init__(self):
        super().__init__()
        self.affine1 = nn.Linear(4, 16)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(16, 2)
        self.value = nn.Linear(16, 1)

    def forward(self, x):
        x = F.relu(self.dropout(self.affine1(x)), inplace=True)
        return F.softmax(self.affine2(x), dim=-1), self.value(x)


@pytest.mark.parametrize("normalize", ["out_of_place", "in_place"])
def test_reinforce_with_baseline_and_returns_normalized_in_place_is_silent(normalize):
    """pytorch/examples reinforce.py / actor_critic.py `finish_episode`: discounted returns built
    with a deque, turned into a tensor and normalized (`(returns - mean) / (std + eps)`, or in
    place: `returns -= returns.mean(); returns /= returns.std() + eps` on a tensor outside the
    graph), advantages `R - value.item()`, `-log_prob * advantage` and a smooth-L1 value loss,
    `torch.stack(...).sum()` and one backward per episode."""
    eps = float(torch.finfo(torch.float32).eps)

    def build():
        policy = Policy()
        return {"modules": [policy], "optimizers": [torch.optim.Adam(policy.parameters(), lr=3e-2)]}

    def train(objs):
        policy, opt = objs["modules"][0], objs["optimizers"][0]
        losses = []
        for _ in range(2):
            saved, rewards = [], []
            for _ in range(5):
                probs, value = policy(torch.randn(1, 4))
                m = torch.distributions.Categorical(probs)
                action = m.sample()
                saved.append((m.log_prob(action), value))
                rewards.append(float(action.item()) - 0.5)
            R, returns = 0.0, deque()
            for r in rewards[::-1]:
                R = r + 0.99 * R
                returns.appendleft(R)
            returns = torch.tensor(returns)
            if normalize == "in_place":
                returns -= returns.mean()
                returns /= returns.std() + eps
            else:
                returns = (returns - returns.mean()) / (returns.std() + eps)
            policy_losses, value_losses = [], []
            for (log_prob, value), R in zip(saved, returns):
                advantage = R - value.item()
                policy_losses.append(-log_prob * advantage)
                value_losses.append(F.smooth_l1_loss(value, torch.tensor([[R]])))
            opt.zero_grad()
            loss = torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return losses

    programs_agree(build, train)


class GradReverse(torch.autograd.Function):
    """DANN's gradient reversal layer (fungtion/DANN functions.py `ReverseLayerF`)."""

    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output.neg() * ctx.alpha, None


def test_domain_adversarial_gradient_reversal_is_silent():
    """fungtion/DANN: features through a gradient reversal layer into a domain classifier (with
    in-place ReLU and BatchNorm), the class head on the same features, one backward."""

    def build():
        model = nn.ModuleDict({
            "feature": nn.Sequential(nn.Linear(6, 12), nn.BatchNorm1d(12), nn.ReLU(inplace=True)),
            "cls": nn.Sequential(nn.Linear(12, 8), nn.ReLU(inplace=True), nn.Linear(8, 3)),
            "dom": nn.Sequential(nn.Linear(12, 8), nn.BatchNorm1d(8), nn.ReLU(inplace=True), nn.Linear(8, 2)),
        })
        return {"modules": [model], "optimizers": [torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)]}

    def train(objs):
        model, opt = objs["modules"][0], objs["optimizers"][0]
        losses = []
        for i in range(3):
            p = i / 3
            alpha = 2.0 / (1.0 + math.exp(-10 * p)) - 1
            xs, ys, xt = torch.randn(4, 6), torch.randint(0, 3, (4,)), torch.randn(4, 6)
            fs, ft = model["feature"](xs), model["feature"](xt)
            loss = F.cross_entropy(model["cls"](fs), ys)
            domain = model["dom"](GradReverse.apply(torch.cat([fs, ft]), alpha))
            loss = loss + F.cross_entropy(domain, torch.cat([torch.zeros(4), torch.ones(4)]).long())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return losses

    programs_agree(build, train)


def test_maml_with_vmap_over_tasks_of_torch_func_grad_is_silent():
    """MAML as the torch.func tutorial writes it: the inner loop is `torch.func.grad` of a
    `functional_call` loss, vmapped over a batch of tasks; the outer loss is backpropagated into
    the meta-parameters (second order through the inner gradient); an in-place ReLU in the model."""
    from torch.func import functional_call, grad, vmap

    def build():
        model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(inplace=True), nn.Linear(16, 1))
        return {"modules": [model], "optimizers": [torch.optim.Adam(model.parameters(), lr=1e-2)]}

    def train(objs):
        model, opt = objs["modules"][0], objs["optimizers"][0]
        losses = []

        def loss_of(params, x, y):
            return F.mse_loss(functional_call(model, params, (x,)), y)

        def adapted_query_loss(params, xs, ys, xq, yq):
            for _ in range(2):
                grads = grad(loss_of)(params, xs, ys)
                params = {k: p - 0.1 * grads[k] for k, p in params.items()}
            return loss_of(params, xq, yq)

        for _ in range(2):
            params = dict(model.named_parameters())
            xs, xq = torch.randn(3, 5, 4), torch.randn(3, 5, 4)
            ys, yq = xs.sum(-1, keepdim=True).sin(), xq.sum(-1, keepdim=True).sin()
            loss = vmap(adapted_query_loss, in_dims=(None, 0, 0, 0, 0))(params, xs, ys, xq, yq).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return losses

    programs_agree(build, train)


class CheckpointedMLP(nn.Module):
    def __init__(self, use_reentrant: bool):
        super().__init__()
        self.use_reentrant = use_reentrant
        self.inp = nn.Linear(6, 12)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(12), nn.Linear(12, 24), nn.ReLU(inplace=True), nn.Dropout(0.2), nn.Linear(24, 12))
            for _ in range(2))
        self.out = nn.Linear(12, 3)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = h + torch.utils.checkpoint.checkpoint(block, h, use_reentrant=self.use_reentrant)
        return self.out(h)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpointed_pre_norm_blocks_with_in_place_relu_and_dropout_are_silent(use_reentrant):
    """Pre-norm residual blocks (LayerNorm, Linear, in-place ReLU, Dropout, Linear) each under
    `torch.utils.checkpoint` (reentrant and not): the recompute replays the dropout mask (RNG state
    preserved) and the in-place ReLU on the recomputed Linear output; no BatchNorm, so no state is
    written twice."""

    def build():
        model = CheckpointedMLP(use_reentrant)
        return {"modules": [model], "optimizers": [torch.optim.AdamW(model.parameters(), lr=1e-2)]}

    programs_agree(build, _steps)


# ---------------------------------------------------------------------------
# 6. the harness itself can fail
# ---------------------------------------------------------------------------


def test_the_harness_fails_on_a_program_with_a_real_hazard():
    """`sigmoid` saves its output; `mul_` on it before backward makes PyTorch raise: the harness
    must not pass such a program (its plain run raises already), nor a program whose watched runs
    report an error while plain PyTorch is silent (a `.data` write to a saved weight)."""

    def build():
        model = nn.Sequential(nn.Linear(6, 4), nn.Linear(4, 3))
        return {"modules": [model], "optimizers": [torch.optim.SGD(model.parameters(), lr=0.1)]}

    def raising(objs):
        h = torch.sigmoid(objs["modules"][0](torch.randn(2, 6)))
        h.mul_(2)
        h.sum().backward()
        return []

    def silent_but_wrong(objs):
        model = objs["modules"][0]
        loss = (model(torch.randn(2, 6)) ** 2).sum()
        model[1].weight.data.mul_(0.5)  # the weight saved for the first layer's grad: silently wrong
        loss.backward()
        return [loss.detach()]

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        programs_agree(build, raising)
    with pytest.raises(AssertionError, match="IPD104"):
        programs_agree(build, silent_but_wrong)


# ---------------------------------------------------------------------------
# 7. library features that write in their own forward or step
# ---------------------------------------------------------------------------


def test_max_norm_embedding_renormalized_in_forward_then_tied_to_the_head_is_silent():
    """`nn.Embedding(max_norm=1.0)` renormalizes the looked-up rows of its weight in place in
    every forward (`embedding_renorm_` under no_grad, on a leaf that requires grad); the weight is
    tied to the output layer, which uses (and saves) it only after the lookup: correct, as the
    PyTorch docs' note on max_norm says."""

    def build():
        emb = nn.Embedding(9, 6, max_norm=1.0)
        head = nn.Linear(6, 9, bias=False)
        head.weight = emb.weight
        model = nn.ModuleDict({"emb": emb, "mix": nn.Linear(6, 6), "head": head})
        return {"modules": [model], "optimizers": [torch.optim.SGD(model.parameters(), lr=0.5)]}

    def train(objs):
        model, opt = objs["modules"][0], objs["optimizers"][0]
        losses = []
        for _ in range(3):
            idx = torch.randint(0, 9, (4, 3))
            logits = model["head"](torch.tanh(model["mix"](model["emb"](idx))))
            loss = F.cross_entropy(logits.reshape(-1, 9), torch.randint(0, 9, (12,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return losses

    programs_agree(build, train)


def test_iterative_magnitude_pruning_between_epochs_is_silent():
    """`torch.nn.utils.prune`: l1_unstructured on two layers (a forward pre-hook computes
    `weight = weight_orig * weight_mask`), pruned again after each epoch (a new mask buffer
    combined with the old), `prune.remove` at the end writing the pruned weight back."""
    from torch.nn.utils import prune

    def build():
        model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(inplace=True), nn.Linear(12, 3))
        for layer in (model[0], model[2]):
            prune.l1_unstructured(layer, "weight", amount=0.2)
        return {"modules": [model], "optimizers": [torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)]}

    def train(objs):
        model = objs["modules"][0]
        losses = []
        for _ in range(2):
            losses += _steps(objs, n=2)
            for layer in (model[0], model[2]):
                prune.l1_unstructured(layer, "weight", amount=0.2)
        for layer in (model[0], model[2]):
            prune.remove(layer, "weight")
        return losses

    programs_agree(build, train)


def test_sparse_embedding_gradients_with_sparse_adam_and_sgd_are_silent():
    """`nn.Embedding(sparse=True)`: sparse gradients accumulated over two backwards (gradient
    accumulation adds sparse tensors), stepped by SparseAdam; a dense head by SGD."""

    def build():
        model = nn.ModuleDict({"emb": nn.EmbeddingBag(12, 6, mode="mean", sparse=True), "head": nn.Linear(6, 2)})
        return {"modules": [model], "optimizers": [torch.optim.SparseAdam(list(model["emb"].parameters()), lr=1e-2),
                                                   torch.optim.SGD(model["head"].parameters(), lr=0.1)]}

    def train(objs):
        model, opts = objs["modules"][0], objs["optimizers"]
        losses = []
        for _ in range(2):
            for opt in opts:
                opt.zero_grad()
            for _ in range(2):
                idx, offsets = torch.randint(0, 12, (7,)), torch.tensor([0, 3])
                loss = F.cross_entropy(model["head"](model["emb"](idx, offsets)), torch.tensor([0, 1])) / 2
                loss.backward()
                losses.append(loss.detach())
            for opt in opts:
                opt.step()
        model["emb"].weight.grad = model["emb"].weight.grad.to_dense()  # compared as dense
        return losses

    programs_agree(build, train)


@pytest.mark.parametrize("foreach", [False, True])
def test_complex_valued_layer_trained_with_adam_is_silent(foreach):
    """A complex-valued linear layer (a spectral filter): complex parameters, which Adam steps
    through `torch.view_as_real` views of the parameters and their state, written in place."""

    class SpectralFilter(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(5, dtype=torch.cfloat) * 0.1)
            self.out = nn.Linear(8, 2)

        def forward(self, x):
            spec = torch.fft.rfft(x, dim=-1)
            y = torch.fft.irfft(spec * self.w, n=8, dim=-1)
            return self.out(F.relu(y, inplace=True))

    def build():
        model = SpectralFilter()
        return {"modules": [model], "optimizers": [torch.optim.Adam(model.parameters(), lr=1e-2, foreach=foreach)]}

    def train(objs):
        model, opt = objs["modules"][0], objs["optimizers"][0]
        losses = []
        for _ in range(3):
            loss = F.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 2, (4,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return losses

    programs_agree(build, train)


def test_an_ensemble_of_stacked_module_states_trained_under_vmap_is_silent():
    """The model-ensembling tutorial's `torch.func.stack_module_state` + `vmap(functional_call)`,
    here trained: the stacked parameters are leaves stepped by Adam."""
    from torch.func import functional_call, stack_module_state, vmap

    def build():
        members = [nn.Sequential(nn.Linear(6, 8), nn.ReLU(inplace=True), nn.Linear(8, 3)) for _ in range(3)]
        params, buffers = stack_module_state(members)
        holder = nn.Module()
        for k, v in params.items():
            holder.register_parameter(k.replace(".", "_"), nn.Parameter(v))
        holder.base = members[0]
        return {"modules": [holder], "optimizers": [torch.optim.Adam([p for n, p in holder.named_parameters()
                                                                      if not n.startswith("base")], lr=1e-2)]}

    def train(objs):
        holder, opt = objs["modules"][0], objs["optimizers"][0]
        names = ["0.weight", "0.bias", "2.weight", "2.bias"]
        losses = []
        for _ in range(3):
            params = {n: getattr(holder, n.replace(".", "_")) for n in names}
            x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
            logits = vmap(functional_call, in_dims=(None, 0, None))(holder.base, params, (x,))
            loss = F.cross_entropy(logits.reshape(-1, 3), y.repeat(3))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return losses

    programs_agree(build, train)


def test_quantization_aware_training_with_observers_written_in_forward_is_silent():
    """Eager-mode QAT (`torch.ao.quantization.prepare_qat` with the x86 QAT qconfig): every
    training forward's FakeQuantize modules update their observers' min/max, scale and zero point
    in place (`fused_moving_avg_obs_fake_quant`) and save what their backward needs; observers
    disabled and BatchNorm frozen for the last step, as the QAT tutorial does."""
    aq = torch.ao.quantization

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.quant, self.dequant = aq.QuantStub(), aq.DeQuantStub()
            self.fc1, self.relu, self.fc2 = nn.Linear(6, 12), nn.ReLU(inplace=True), nn.Linear(12, 3)

        def forward(self, x):
            return self.dequant(self.fc2(self.relu(self.fc1(self.quant(x)))))

    def build():
        model = Net().train()
        model.qconfig = aq.get_default_qat_qconfig("x86")
        model = aq.prepare_qat(model)
        return {"modules": [model], "optimizers": [torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)]}

    def train(objs):
        model = objs["modules"][0]
        losses = _steps(objs, n=2)
        model.apply(aq.disable_observer)
        return losses + _steps(objs, n=1)

    programs_agree(build, train)


def _compress(t: torch.Tensor) -> Any:
    """Activation compression (ActNN/GACT-style, reduced to a dtype cast): saved as bfloat16."""
    return (t.dtype, t.to(torch.bfloat16))


def _decompress(packed: Any) -> torch.Tensor:
    dtype, t = packed
    return t.to(dtype)


def test_activation_compression_hooks_inside_the_watched_loop_are_silent():
    """The program's own `saved_tensors_hooks` (saved activations kept as bfloat16) around each
    forward and backward inside the watch: they are on top of the tracer's, and gradients are the
    compressed ones, as without the tool."""

    def build():
        model = _mlp()
        return {"modules": [model], "optimizers": [torch.optim.SGD(model.parameters(), lr=0.1)]}

    def train(objs):
        with torch.autograd.graph.saved_tensors_hooks(_compress, _decompress):
            return _steps(objs)

    sessions = programs_agree(build, train)
    assert sessions["fast"].tracer.writes > 0


@pytest.mark.parametrize("deep", [False, True])
def test_activation_compression_hooks_entered_before_the_watch_still_apply(deep):
    """`with saved_tensors_hooks(compress, decompress): with ipd.watch(): train()`: a framework
    that wraps the whole run in its hooks, then the watch. The gradients must be the compressed
    ones, as without the tool (whose own hooks, on top, would make the program's stop applying):
    the tracer sets none and the report says it saw no saved tensor."""
    notes: list[str] = []

    def run(watch: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = _mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(1)
        with torch.autograd.graph.saved_tensors_hooks(_compress, _decompress):
            if watch:
                with ipd.watch(model, deep=deep) as session:
                    _steps({"modules": [model], "optimizers": [opt]})
                notes.extend(session.report().notes)
            else:
                _steps({"modules": [model], "optimizers": [opt]})
        return [p.detach().clone() for p in model.parameters()]

    assert _same(run(False), run(True))
    assert any("saw no saved tensor" in note for note in notes), notes


# ---------------------------------------------------------------------------
# 8. state written between a forward and its backward, through copies
# ---------------------------------------------------------------------------


class MemoryBank(nn.Module):
    """HobbitLong/CMC NCEAverage: per-instance embeddings in a buffer; the forward scores the batch
    against rows picked by `index_select` (a copy, detached), then, under no_grad, updates the picked
    rows by momentum and writes them back with `memory.index_copy_`, before the loss's backward."""

    def __init__(self, n: int, d: int, k: int = 4, momentum: float = 0.5):
        super().__init__()
        self.k, self.momentum = k, momentum
        self.register_buffer("memory", F.normalize(torch.randn(n, d), dim=1))

    def forward(self, z, y):
        idx = torch.randint(0, self.memory.shape[0], (z.shape[0], self.k + 1))
        idx[:, 0] = y
        weight = torch.index_select(self.memory, 0, idx.view(-1)).detach().view(z.shape[0], self.k + 1, -1)
        out = torch.bmm(weight, z.unsqueeze(2)).squeeze(2).div(0.1)
        with torch.no_grad():
            pos = torch.index_select(self.memory, 0, y)
            pos.mul_(self.momentum)
            pos.add_(torch.mul(z, 1 - self.momentum))
            self.memory.index_copy_(0, y, F.normalize(pos, dim=1))
        return out


def test_instance_memory_bank_written_between_forward_and_backward_through_copies_is_silent():
    def build():
        model = nn.ModuleDict({"enc": nn.Sequential(nn.Linear(6, 8), nn.ReLU(inplace=True), nn.Linear(8, 4)),
                               "bank": MemoryBank(10, 4)})
        return {"modules": [model], "optimizers": [torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)]}

    def train(objs):
        model, opt = objs["modules"][0], objs["optimizers"][0]
        losses = []
        for _ in range(3):
            y = torch.randperm(10)[:4]
            z = F.normalize(model["enc"](torch.randn(4, 6)), dim=1)
            out = model["bank"](z, y)
            loss = F.cross_entropy(out, torch.zeros(4, dtype=torch.long))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return losses

    programs_agree(build, train)


def test_truncated_bptt_with_in_place_detach_of_the_carried_state_is_silent():
    """Truncated BPTT where the carried LSTM state is cut with `h.detach_()` / `c.detach_()` after
    each chunk's backward and step (in place, instead of `repackage_hidden`'s new tensors)."""

    def build():
        model = nn.ModuleDict({"rnn": nn.LSTM(3, 6, batch_first=True), "out": nn.Linear(6, 3)})
        return {"modules": [model], "optimizers": [torch.optim.Adam(model.parameters(), lr=1e-2)]}

    def train(objs):
        model, opt = objs["modules"][0], objs["optimizers"][0]
        h, c = torch.zeros(1, 2, 6), torch.zeros(1, 2, 6)
        losses = []
        for _ in range(3):
            x = torch.randn(2, 4, 3)
            y, (h, c) = model["rnn"](x, (h, c))
            loss = F.mse_loss(model["out"](y), x.roll(-1, dims=1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            h.detach_()
            c.detach_()
            losses.append(loss.detach())
        return losses

    programs_agree(build, train)


class NormalizingNet(nn.Module):
    """A forward that standardizes its input batch in place (`x.sub_(mean).div_(std)`), as some
    data-pipeline-in-the-model code does; the caller never reads the batch afterwards."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.zeros(6))
        self.register_buffer("std", torch.ones(6) * 2)
        self.body = _mlp()

    def forward(self, x):
        x.sub_(self.mean).div_(self.std)
        return self.body(x)


def test_a_model_normalizing_its_input_in_place_warns_ipd106_at_once_and_changes_nothing():
    """Each batch is made, passed and dropped, so this program is correct; but IPD106 reports a
    write no flag asked for (`x.sub_`, `x.div_` on the argument) at once, not at the caller's next
    read (docs/rules/IPD106.md, "When it is reported"): a warning that is true as stated (the
    caller's tensor is changed), about code that would break the day the caller logs its batch.
    Only `inplace=True` writes wait for the caller's read."""

    def build():
        model = NormalizingNet()
        return {"modules": [model], "optimizers": [torch.optim.SGD(model.parameters(), lr=0.1)]}

    def train(objs):
        model, opt = objs["modules"][0], objs["optimizers"][0]
        losses = []
        for _ in range(3):
            loss = F.cross_entropy(model(torch.randn(5, 6)), torch.randint(0, 3, (5,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return losses

    programs_agree(build, train, warnings=frozenset({"IPD106"}))


def test_hessians_jacobians_forward_mode_ad_and_batched_grads_are_silent():
    """Second-order tools on a small network: `torch.autograd.functional.hessian` (vectorized:
    vmap over backward), `jacobian` with `strategy="forward-mode"`, `hvp`, a forward-mode jvp
    through an in-place ReLU on dual tensors (`fwAD.make_dual`), and `autograd.grad` with
    `is_grads_batched=True`; then one training step."""
    import torch.autograd.forward_ad as fwAD

    def build():
        model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
        return {"modules": [model], "optimizers": [torch.optim.SGD(model.parameters(), lr=0.1)]}

    def train(objs):
        model, opt = objs["modules"][0], objs["optimizers"][0]
        x = torch.randn(4, 3)

        def f(w):
            return F.linear(torch.tanh(F.linear(x, w, model[0].bias)), model[2].weight, model[2].bias).square().sum()

        w = model[0].weight.detach()
        out = [
            torch.autograd.functional.hessian(f, w, vectorize=True),
            torch.autograd.functional.jacobian(lambda w_: F.linear(x, w_).relu(), w, vectorize=True, strategy="forward-mode"),
            torch.autograd.functional.hvp(f, w, torch.ones_like(w))[1],
        ]
        with fwAD.dual_level():
            h = model[0](fwAD.make_dual(x, torch.ones_like(x)))
            h.relu_()
            out.append(fwAD.unpack_dual(model[2](h)).tangent)
        grad_outputs = torch.eye(2).unsqueeze(1).expand(2, 4, 2).contiguous()
        out.append(torch.autograd.grad(model(x), model[0].weight, grad_outputs, is_grads_batched=True)[0])
        opt.zero_grad()
        loss = f(model[0].weight)
        loss.backward()
        opt.step()
        return out + [loss.detach()]

    programs_agree(build, train)
