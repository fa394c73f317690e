"""Common training idioms stay clean under `watch()`; the two classic broken ones are flagged.

"Clean" means: no finding of severity error or warning, no exception, and (where cheap)
parameters, buffers and gradients bit-identical to the same code run without `watch()`
from the same seeds. Every test runs a real (small) model for 2-3 steps.

The negative side: the broken GAN order (discriminator step between the generator's
forward and its backward) raises `InplaceError` naming the `opt_d.step()` line, and
`checkpoint` agrees with plain PyTorch in both its reentrant and non-reentrant modes.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import inplace_doctor as ipd
from inplace_doctor import Severity
from inplace_doctor.rules import FAST_MODE_RULES

HERE = Path(__file__).resolve()


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a loaded machine OpenMP's spinning threads make these tiny models
    10-20x slower; both runs of each comparison use the same setting, so results stay bit-exact."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def load_program(folder: Path, name: str) -> Any:
    """Import `folder/<name>.py` (plain files, no package) once, as a module of its own."""
    key = f"_ipd_{folder.name}_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


def has_error(findings, code: str) -> bool:
    return any(f.code == code and f.severity is Severity.ERROR for f in findings)


def line_of(tag: str) -> int:
    """The line of this file carrying the comment `# <<tag>>` (exactly one)."""
    needle = "# <<" + tag + ">>"
    lines = [i for i, text in enumerate(HERE.read_text().splitlines(), 1) if text.rstrip().endswith(needle)]
    assert len(lines) == 1, (tag, lines)
    return lines[0]


def serious(findings) -> list:
    return [f for f in findings if f.severity in (Severity.ERROR, Severity.WARNING)]


def assert_clean(session: ipd.watch, expected: frozenset[str] = frozenset()) -> None:
    bad = [f for f in serious(session.findings) if f.code not in expected]
    assert not bad, "\n\n".join(f"{f.code} {f.severity}: {f.message}" for f in bad)


def snapshot(*modules: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters, buffers and gradients of `modules`, cloned."""
    out: dict[str, torch.Tensor] = {}
    for i, m in enumerate(modules):
        for name, t in m.state_dict(keep_vars=True).items():
            out[f"{i}.{name}"] = t.detach().clone()
        for name, p in m.named_parameters():
            if p.grad is not None:
                out[f"{i}.{name}.grad"] = p.grad.detach().clone()
    return out


def assert_identical(plain: dict[str, torch.Tensor], watched: dict[str, torch.Tensor]) -> None:
    assert plain.keys() == watched.keys()
    differ = [k for k in plain if not torch.equal(plain[k], watched[k])]
    assert not differ, f"differ from the run without watch(): {differ[:10]}"


def twin(
    build: Callable[[], Any],
    train: Callable[[Any], Any],
    modules: Callable[[Any], tuple],
    *,
    seed: int = 0,
    expected: frozenset[str] = frozenset(),
    **watch_options: Any,
):
    """Run `train(build())` plain, then again inside watch() from the same seeds.

    Asserts the watched run is clean and leaves parameters, buffers and gradients
    bit-identical to the plain run. Returns (session, plain objects, watched objects).
    """
    torch.manual_seed(seed)
    plain_objs = build()
    torch.manual_seed(seed + 1)
    train(plain_objs)
    plain = snapshot(*modules(plain_objs))

    torch.manual_seed(seed)
    objs = build()
    torch.manual_seed(seed + 1)
    with ipd.watch(*modules(objs), **watch_options) as session:
        train(objs)
    assert_clean(session, expected)
    assert session.tracer.saves > 0 and session.tracer.writes > 0  # it did trace the training
    assert_identical(plain, snapshot(*modules(objs)))
    return session, plain_objs, objs


def _modes(deep: bool) -> dict[str, Any]:
    """`watch`'s options: the deep tracer, or the fast one (the default) with the rules it serves."""
    return {"deep": True} if deep else {"deep": False, "select": sorted(FAST_MODE_RULES)}


def small_cnn(num_classes: int = 5) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(inplace=True),
        nn.Conv2d(8, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(0.2),
        nn.Linear(8, num_classes),
    )


def mlp(din: int = 6, dh: int = 16, dout: int = 3) -> nn.Module:
    return nn.Sequential(
        nn.Linear(din, dh),
        nn.ReLU(inplace=True),
        nn.Dropout(0.1),
        nn.Linear(dh, dh),
        nn.BatchNorm1d(dh),
        nn.ReLU(inplace=True),
        nn.Linear(dh, dout),
    )


def images(n: int = 4, size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 3, size, size), torch.randint(0, 5, (n,))


def with_sgd(model: nn.Module, **kw: Any) -> tuple[nn.Module, torch.optim.Optimizer]:
    kw.setdefault("lr", 0.1)
    return model, torch.optim.SGD(model.parameters(), **kw)


def model_of(objs: tuple) -> tuple[nn.Module]:
    return (objs[0],)


# ---------------------------------------------------------------------------
# 1. gradient accumulation
# ---------------------------------------------------------------------------


def test_gradient_accumulation_over_several_backwards_is_clean():
    def train(objs):
        model, opt = objs
        for _ in range(2):
            opt.zero_grad(set_to_none=True)
            for _ in range(3):  # three micro-batches, one optimizer step
                x, y = images()
                loss = F.cross_entropy(model(x), y) / 3
                loss.backward()
            opt.step()

    twin(lambda: with_sgd(small_cnn(), momentum=0.9), train, model_of)


def test_gradient_accumulation_without_zeroing_to_none_is_clean():
    # zero_grad(set_to_none=False) keeps the .grad tensors and writes zeros into them in place.
    def train(objs):
        model, opt = objs
        for _ in range(2):
            opt.zero_grad(set_to_none=False)
            for _ in range(2):
                x = torch.randn(5, 6)
                (model(x).pow(2).mean() / 2).backward()
            opt.step()

    twin(lambda: with_sgd(mlp(), momentum=0.9, nesterov=True), train, model_of)


# ---------------------------------------------------------------------------
# 2. gradient clipping
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("foreach", [None, False, True])
def test_clip_grad_norm_between_backward_and_step_is_clean(foreach):
    def train(objs):
        model, opt = objs
        for _ in range(3):
            opt.zero_grad()
            x, y = images()
            F.cross_entropy(model(x), y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05, foreach=foreach)
            torch.nn.utils.clip_grad_value_(model.parameters(), clip_value=0.02, foreach=foreach)
            opt.step()

    twin(lambda: with_sgd(small_cnn()), train, model_of)


# ---------------------------------------------------------------------------
# 3. EMA of the weights
# ---------------------------------------------------------------------------


def _ema_build():
    model = small_cnn()
    ema = small_cnn()
    ema.load_state_dict(model.state_dict())
    for p in ema.parameters():
        p.requires_grad_(False)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2), ema


@pytest.mark.parametrize("variant", ["mul_add", "foreach_lerp"])
def test_ema_update_under_no_grad_after_step_is_clean(variant):
    def train(objs):
        model, opt, ema = objs
        for _ in range(3):
            opt.zero_grad()
            x, y = images()
            out = model(x)
            F.cross_entropy(out, y).backward()
            opt.step()
            with torch.no_grad():
                if variant == "mul_add":
                    for ema_p, p in zip(ema.parameters(), model.parameters()):
                        ema_p.mul_(0.99).add_(p, alpha=0.01)
                else:
                    torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 0.01)
                for ema_b, b in zip(ema.buffers(), model.buffers()):
                    ema_b.copy_(b)
            # evaluate the EMA copy mid-training
            ema.eval()
            with torch.no_grad():
                ema(x)

    twin(_ema_build, train, lambda objs: (objs[0], objs[2]))


# ---------------------------------------------------------------------------
# 4. WGAN-GP gradient penalty (double backward)
# ---------------------------------------------------------------------------


def _critic() -> nn.Module:
    return nn.Sequential(
        nn.Linear(6, 16),
        nn.LeakyReLU(0.2, inplace=True),
        nn.Linear(16, 16),
        nn.LayerNorm(16),
        nn.ReLU(inplace=True),
        nn.Linear(16, 1),
    )


def _generator() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(inplace=True), nn.Linear(16, 6), nn.Tanh())


def test_wgan_gp_gradient_penalty_with_create_graph_is_clean():
    def build():
        G, D = _generator(), _critic()
        opt_g = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.9))
        opt_d = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.9))
        return G, D, opt_g, opt_d

    def train(objs):
        G, D, opt_g, opt_d = objs
        for _ in range(2):
            real = torch.randn(8, 6)
            fake = G(torch.randn(8, 4))
            # critic step
            opt_d.zero_grad()
            alpha = torch.rand(8, 1)
            interp = (alpha * real + (1 - alpha) * fake.detach()).requires_grad_(True)
            (grad,) = torch.autograd.grad(D(interp).sum(), interp, create_graph=True)
            gp = ((grad.norm(2, dim=1) - 1) ** 2).mean()
            d_loss = D(fake.detach()).mean() - D(real).mean() + 10 * gp
            d_loss.backward()
            opt_d.step()
            # generator step
            opt_g.zero_grad()
            (-D(fake).mean()).backward()
            opt_g.step()

    twin(build, train, lambda objs: objs[:2])


def test_gradient_penalty_on_parameters_backward_through_penalty_is_clean():
    # R1-style penalty over the parameters' gradients: autograd.grad w.r.t. parameters with create_graph.
    def build():
        model = mlp()
        return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def train(objs):
        model, opt = objs
        for _ in range(2):
            opt.zero_grad()
            x = torch.randn(6, 6)
            loss = model(x).pow(2).mean()
            grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
            penalty = sum(g.pow(2).sum() for g in grads)
            (loss + 0.1 * penalty).backward()
            opt.step()

    twin(build, train, model_of)


# ---------------------------------------------------------------------------
# 5. retained graphs
# ---------------------------------------------------------------------------


def test_two_backwards_through_a_retained_graph_then_step_is_clean():
    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = small_cnn(num_classes=8)
            self.cls = nn.Linear(8, 5)
            self.reg = nn.Linear(8, 1)

        def forward(self, x):
            h = F.relu(self.body(x), inplace=True)
            return self.cls(h), self.reg(h)

    def train(objs):
        model, opt = objs
        for _ in range(2):
            opt.zero_grad()
            x, y = images()
            logits, value = model(x)
            F.cross_entropy(logits, y).backward(retain_graph=True)
            value.pow(2).mean().backward()
            opt.step()

    twin(lambda: with_sgd(TwoHeads(), momentum=0.9), train, model_of)


def test_backward_retain_graph_then_step_each_iteration_is_clean():
    # The retained graph of step k is still alive when opt.step() overwrites the weights it
    # saved; it is dropped only when `loss` is rebound at step k+1 and never backwarded again.
    def train(objs):
        model, opt = objs
        loss = None
        for _ in range(3):
            opt.zero_grad()
            x, y = images()
            loss = F.cross_entropy(model(x), y)
            loss.backward(retain_graph=True)
            opt.step()
        return loss

    twin(lambda: with_sgd(small_cnn(), momentum=0.9), train, model_of)


# ---------------------------------------------------------------------------
# 6. CPU autocast bfloat16
# ---------------------------------------------------------------------------


def test_cpu_autocast_bfloat16_forward_backward_step_is_clean():
    def train(objs):
        model, opt = objs
        for _ in range(2):
            opt.zero_grad()
            x, y = images()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x)
                loss = F.cross_entropy(out.float(), y)
            assert out.dtype == torch.bfloat16
            loss.backward()
            opt.step()

    def build():
        model = small_cnn()
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    twin(build, train, model_of)


# ---------------------------------------------------------------------------
# 7. channels_last (torchvision resnet18)
# ---------------------------------------------------------------------------


def test_channels_last_resnet18_training_is_clean():
    torchvision = pytest.importorskip("torchvision")

    def build():
        model = torchvision.models.resnet18(weights=None, num_classes=10).to(memory_format=torch.channels_last)
        return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)

    def train(objs):
        model, opt = objs
        for _ in range(2):
            opt.zero_grad()
            x = torch.randn(2, 3, 32, 32).to(memory_format=torch.channels_last)
            y = torch.randint(0, 10, (2,))
            F.cross_entropy(model(x), y).backward()
            opt.step()
        assert model.conv1.weight.is_contiguous(memory_format=torch.channels_last)

    twin(build, train, model_of)


# ---------------------------------------------------------------------------
# 8. inference_mode / no_grad evaluation with in-place ReLU
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["inference_mode", "no_grad"])
def test_eval_forward_with_inplace_relu_is_clean(mode):
    guard = torch.inference_mode if mode == "inference_mode" else torch.no_grad

    def train(objs):
        model, opt = objs
        outs = []
        for _ in range(2):
            model.train()
            opt.zero_grad()
            x, y = images()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            model.eval()  # validation between training steps
            with guard():
                outs.append(model(x).clone() if mode == "no_grad" else model(x))
        return outs

    session, plain_objs, objs = twin(lambda: with_sgd(small_cnn()), train, model_of)

    # The evaluation outputs themselves agree too.
    torch.manual_seed(7)
    x = torch.randn(3, 3, 8, 8)
    with guard():
        expected = plain_objs[0](x)
    assert_clean(session)
    with ipd.watch(objs[0]) as eval_session, guard():
        got = objs[0](x)
    assert_clean(eval_session)
    assert torch.equal(expected, got)


def test_inference_mode_forward_of_resnet18_is_clean():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        expected = model(x)
    with ipd.watch(model) as session, torch.inference_mode():
        got = model(x)
    assert_clean(session)
    assert got.is_inference()
    assert torch.equal(expected, got)


# ---------------------------------------------------------------------------
# 9. activation checkpointing
# ---------------------------------------------------------------------------


def conv_bn_relu(c: int = 8) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True))


class CheckpointedNet(nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())  # output requires grad
        self.blocks = nn.Sequential(conv_bn_relu(), nn.Dropout(0.1), conv_bn_relu())
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))

    def forward(self, x):
        h = self.stem(x)
        if self.how == "reentrant":
            h = checkpoint(self.blocks, h, use_reentrant=True)
        elif self.how == "non_reentrant":
            h = checkpoint(self.blocks, h, use_reentrant=False)
        elif self.how == "sequential_reentrant":
            h = checkpoint_sequential(self.blocks, 2, h, use_reentrant=True)
        else:
            h = checkpoint_sequential(self.blocks, 2, h, use_reentrant=False)
        return self.head(h)


@pytest.mark.parametrize("deep", [True, False], ids=["deep", "fast"])
@pytest.mark.parametrize("how", ["reentrant", "non_reentrant", "sequential_reentrant", "sequential_non_reentrant"])
def test_checkpointed_conv_bn_inplace_relu_blocks_train_exactly_and_report_the_bn_recompute(how, deep):
    def build():
        model = CheckpointedNet(how)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def train(objs):
        model, opt = objs
        for _ in range(2):
            opt.zero_grad()
            x, y = images()
            F.cross_entropy(model(x), y).backward()
            opt.step()

    # Training is exact (bit-identical, no IPD101/IPD105), but BatchNorm inside a
    # checkpointed region updates its running statistics again on recompute: IPD108.
    # The fast tracer (issue 26), with the rules it serves, runs per op inside the regions only.
    session, _, _ = twin(build, train, model_of, expected=frozenset({"IPD108"}), **_modes(deep))
    assert session.deep is deep
    repeated = [f for f in session.findings if f.code == "IPD108"]
    assert repeated and all(f.mutation.module_type == "BatchNorm2d" for f in repeated)


# ---------------------------------------------------------------------------
# 10. optimizers, and the correct GAN loop
# ---------------------------------------------------------------------------

OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "adam_foreach": lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=True),
    "adamw_not_fused": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, fused=False),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_steps_are_clean(name):
    def build():
        model = small_cnn()
        return model, OPTIMIZERS[name](model.parameters())

    def train(objs):
        model, opt = objs
        for _ in range(3):
            opt.zero_grad()
            x, y = images()
            F.cross_entropy(model(x), y).backward()
            opt.step()

    twin(build, train, model_of)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 16)
        self.bn = nn.BatchNorm1d(16)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(16, 6)

    def forward(self, z):
        return torch.tanh(self.fc2(self.act(self.bn(self.fc1(z)))))


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.act = nn.LeakyReLU(0.2, inplace=True)
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(16, 1)

    def forward(self, x):
        h = self.drop(self.act(self.fc1(x)))  # <<d-forward-fc1>>
        return self.fc2(h)  # <<d-forward-fc2>>


def _gan():
    G, D = Generator(), Discriminator()
    return G, D, torch.optim.Adam(G.parameters(), lr=2e-3, betas=(0.5, 0.999)), torch.optim.Adam(
        D.parameters(), lr=2e-3, betas=(0.5, 0.999)
    )


def test_classic_gan_loop_with_detach_is_clean():
    def train(objs):
        G, D, opt_g, opt_d = objs
        for _ in range(3):
            real = torch.randn(8, 6)
            fake = G(torch.randn(8, 4))
            # D step on fake.detach()
            opt_d.zero_grad()
            d_real, d_fake = D(real), D(fake.detach())
            d_loss = F.binary_cross_entropy_with_logits(d_real, torch.ones_like(d_real)) + (
                F.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake))
            )
            d_loss.backward()
            opt_d.step()
            # then the G step, through the freshly updated D
            opt_g.zero_grad()
            g_out = D(fake)
            F.binary_cross_entropy_with_logits(g_out, torch.ones_like(g_out)).backward()
            opt_g.step()

    twin(_gan, train, lambda objs: objs[:2])


# ---------------------------------------------------------------------------
# 11. DistributedDataParallel, 2 processes, gloo on CPU
# ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load_ddp_worker():
    spec = importlib.util.spec_from_file_location("_ipd_ddp_worker", HERE.parent / "_ddp_worker.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
@pytest.mark.skipif(sys.platform != "linux", reason="forks the test process (fast: no second torch import)")
def test_ddp_two_process_gloo_training_is_clean(tmp_path):
    if not torch.distributed.is_gloo_available():
        pytest.skip("gloo backend unavailable")
    worker = _load_ddp_worker()
    world = 2
    # DDP's constructor imports torch._dynamo (seconds, on a loaded machine): once, here, not per rank.
    importlib.import_module("torch._dynamo")
    # fork: the ranks inherit the imported torch (a fresh `import torch` takes 5-10 s on a loaded
    # machine). Nothing here has initialised a process group or CUDA, and each rank runs 1 thread.
    ctx = torch.multiprocessing.start_processes(
        worker.run, args=(world, _free_port(), str(tmp_path)), nprocs=world, join=False, start_method="fork"
    )
    deadline = time.monotonic() + 40
    try:
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                pytest.fail("DDP ranks did not finish within 40 s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)

    worker.check([json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(world)])


# ---------------------------------------------------------------------------
# 12. FLAGGED: the broken GAN order
# ---------------------------------------------------------------------------


def _broken_gan_step_separate(G, D, opt_g, opt_d):
    real, z = torch.randn(8, 6), torch.randn(8, 4)
    fake = G(z)
    d_out = D(fake)  # the generator's loss, computed too early: its graph saves D's weights
    g_loss = F.binary_cross_entropy_with_logits(d_out, torch.ones_like(d_out))
    d_real, d_fake = D(real), D(fake.detach())
    d_loss = F.binary_cross_entropy_with_logits(d_real, torch.ones_like(d_real)) + (
        F.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake))
    )
    opt_d.zero_grad()
    d_loss.backward()
    opt_d.step()  # <<broken-gan-d-step-separate>>
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()


def _broken_gan_step_retained(G, D, opt_g, opt_d):
    d_out = D(G(torch.randn(8, 4)))  # one forward for both losses
    g_loss = F.binary_cross_entropy_with_logits(d_out, torch.ones_like(d_out))
    d_loss = F.binary_cross_entropy_with_logits(d_out, torch.zeros_like(d_out))
    opt_d.zero_grad()
    d_loss.backward(retain_graph=True)
    opt_d.step()  # <<broken-gan-d-step-retained>>
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()


BROKEN_GAN = {"separate": _broken_gan_step_separate, "retained": _broken_gan_step_retained}


def _d_forward_lines() -> set[int]:
    return {line_of("d-forward-fc1"), line_of("d-forward-fc2")}


@pytest.mark.parametrize("variant", list(BROKEN_GAN))
def test_broken_gan_order_is_flagged_at_the_discriminator_step(variant):
    step = BROKEN_GAN[variant]
    torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        step(*_gan())

    torch.manual_seed(0)
    G, D, opt_g, opt_d = _gan()
    with pytest.raises(ipd.InplaceError) as excinfo, ipd.watch(G, D) as session:
        step(G, D, opt_g, opt_d)
    assert isinstance(excinfo.value, RuntimeError)
    assert excinfo.value.findings and all(f.code == "IPD101" for f in excinfo.value.findings)

    step_line = line_of(f"broken-gan-d-step-{variant}")
    d_lines = _d_forward_lines()
    hits = [
        f
        for f in session.findings
        if f.code == "IPD101" and f.mutation.file == str(HERE) and f.mutation.line == step_line
    ]
    assert hits, "\n\n".join(f"{f.code} {f.mutation.location}: {f.message}" for f in session.findings)
    for f in hits:
        assert f.severity is Severity.ERROR
        assert f.mutation.code == f"opt_d.step()  # <<broken-gan-d-step-{variant}>>"
        assert f.mutation.api is not None and f.mutation.api.endswith("step"), f.mutation.api
        assert f.saved is not None
        assert f.saved.file == str(HERE) and f.saved.line in d_lines, f.saved
        assert f.saved.module in {"D.fc1", "D.fc2"}, f.saved.module  # named by the variable passed to watch()
    # The finding backward confirmed (the one raised) names the D step too.
    raised = excinfo.value.findings[0]
    assert raised.mutation.line == step_line and raised.saved.line in d_lines
    assert raised.confirmed is True


def test_broken_gan_order_is_flagged_with_a_single_model_root():
    torch.manual_seed(0)
    G, D, opt_g, opt_d = _gan()
    with pytest.raises(ipd.InplaceError), ipd.watch(D) as session:
        _broken_gan_step_separate(G, D, opt_g, opt_d)
    step_line = line_of("broken-gan-d-step-separate")
    hits = [f for f in session.findings if f.code == "IPD101" and f.mutation.line == step_line]
    assert hits, [f.message for f in session.findings]
    assert {f.saved.module for f in hits} <= {"fc1", "fc2"}


def test_broken_gan_order_fail_fast_raises_at_the_generator_backward_with_the_step_chained():
    # The step itself may be harmless (the graph could be freed unread): fail_fast raises when the
    # generator's backward reaches the overwritten weights, with the step's stack chained in front.
    torch.manual_seed(0)
    G, D, opt_g, opt_d = _gan()
    with pytest.raises(ipd.InplaceError) as excinfo, ipd.watch(G, D, fail_fast=True):
        _broken_gan_step_separate(G, D, opt_g, opt_d)
    step_line = line_of("broken-gan-d-step-separate")
    assert excinfo.value.findings[0].mutation.line == step_line
    pytorch_error = excinfo.value.__cause__
    assert isinstance(pytorch_error, RuntimeError) and "modified by an inplace operation" in str(pytorch_error)
    written = pytorch_error.__cause__
    assert isinstance(written, ipd.WrittenHere)
    assert f'File "{HERE}", line {step_line}' in str(written) and "opt_d.step()" in str(written)
    printed = "".join(traceback.format_exception(excinfo.value))
    assert printed.index("WrittenHere") < printed.index("modified by an inplace operation") < printed.index("InplaceError")


# ---------------------------------------------------------------------------
# 13. checkpoint around an in-place write to a tensor its own op saved
# ---------------------------------------------------------------------------


def _sigmoid_then_mul_(x):
    y = torch.sigmoid(x)
    y.mul_(2)
    return y


def _checkpointed(use_reentrant: bool):
    torch.manual_seed(0)
    lin = nn.Linear(5, 5)
    x = torch.randn(3, 5)

    def run():
        h = lin(x)  # requires grad, so the reentrant checkpoint has an input needing grad
        out = checkpoint(_sigmoid_then_mul_, h, use_reentrant=use_reentrant)
        out.pow(2).sum().backward()

    return lin, run


@pytest.mark.parametrize("deep", [True, False], ids=["deep", "fast"])
def test_non_reentrant_checkpoint_agrees_with_plain_pytorch(deep):
    lin, run = _checkpointed(use_reentrant=False)
    try:
        run()
        plain_raised = None
    except RuntimeError as e:  # pragma: no cover - depends on the torch release
        plain_raised = e
    plain_grads = [p.grad.clone() for p in lin.parameters()] if plain_raised is None else None

    lin2, run2 = _checkpointed(use_reentrant=False)
    if plain_raised is not None:  # pragma: no cover
        with pytest.raises(RuntimeError), ipd.watch(lin2, **_modes(deep)):
            run2()
        return
    # torch 2.x: no error; the recompute rebuilds the saved value, so watch() must not raise either.
    with ipd.watch(lin2, **_modes(deep)) as session:
        run2()
    assert_clean(session)
    assert all(torch.equal(a, p.grad) for a, p in zip(plain_grads, lin2.parameters()))


@pytest.mark.parametrize("deep", [True, False], ids=["deep", "fast"])
def test_reentrant_checkpoint_raises_like_plain_pytorch(deep):
    lin, run = _checkpointed(use_reentrant=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        run()

    lin2, run2 = _checkpointed(use_reentrant=True)
    with pytest.raises(RuntimeError) as excinfo, ipd.watch(lin2, **_modes(deep)) as session:
        run2()
    assert isinstance(excinfo.value, ipd.InplaceError)
    [f] = [f for f in session.findings if f.code == "IPD101"]
    assert f.severity is Severity.ERROR
    assert f.mutation.code == "y.mul_(2)"
    assert f.saved is not None and f.saved.code == "y = torch.sigmoid(x)"
