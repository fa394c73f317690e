"""IPD111: a checkpointed region's recompute compared with its forward, through watch, audit and `run`.

Acceptance (issue 16, part 3): a checkpointed region with dropout and preserve_rng_state=False, and
one whose recompute reads state the step changed, are reported; with preserve_rng_state=True nothing
is. Applying each printed fix makes the recompute match: the gradients equal the un-checkpointed
program's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import inplace_doctor as ipd
from inplace_doctor.causes import RecomputeCause
from inplace_doctor.rules import FAST_MODE_RULES
from inplace_doctor.trace.checkpoint.checkpoint_blocks import RegionCount
from inplace_doctor.trace.checkpoint.recompute import fingerprint

FIXTURES = Path(__file__).resolve().parent / "IPD111"


class FeedForward(nn.Module):
    def __init__(self, preserve_rng_state: bool | None = None) -> None:
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)
        self.drop = nn.Dropout(0.3)
        self.preserve = preserve_rng_state  # None: no checkpoint at all

    def block(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.down(torch.relu(self.up(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.preserve is None:
            return self.block(x)
        return checkpoint(self.block, x, use_reentrant=False, preserve_rng_state=self.preserve)


#: each check under both tracers: the fast one runs per op inside checkpoint regions (issue 26)
MODES = pytest.mark.parametrize("deep", [True, False], ids=["deep", "fast"])


def _watch(deep: bool, **options: object) -> ipd.watch:
    """`watch` with the deep tracer, or the fast one (the default) with the rules it serves."""
    if deep:
        return ipd.watch(deep=True, **options)  # type: ignore[arg-type]
    session = ipd.watch(deep=False, select=sorted(FAST_MODE_RULES), **options)  # type: ignore[arg-type]
    assert not session.deep
    return session


def _ipd111(findings: list[ipd.Finding]) -> list[ipd.Finding]:
    return [f for f in findings if f.code == "IPD111"]


def _grads(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    torch.manual_seed(1)
    model.zero_grad(set_to_none=True)
    model(x).pow(2).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


# -- the fingerprint ------------------------------------------------------------


def test_the_fingerprint_is_exact_and_keeps_nothing() -> None:
    t = torch.randn(64, 32)
    assert fingerprint(t) == fingerprint(t.clone())
    nudged = t.clone()
    nudged.view(-1)[7] = torch.nextafter(nudged.view(-1)[7], torch.tensor(float("inf")))
    assert fingerprint(nudged) != fingerprint(t)  # one ulp
    assert fingerprint(t.t()) == fingerprint(t.t().contiguous())  # layout does not matter, values do
    for other in (torch.arange(10), torch.rand(5) > 0.5, torch.randn(4, dtype=torch.float16),
                  torch.randn(4, dtype=torch.bfloat16), torch.randn(3, dtype=torch.complex64), torch.empty(0)):
        assert fingerprint(other) == fingerprint(other.clone())
    assert fingerprint(torch.ones(4)) != fingerprint(torch.full((4,), 2.0))  # no xor-style cancellation
    version, ref = t._version, weakref.ref(t)
    fingerprint(t)
    assert t._version == version
    del t
    assert ref() is None


# -- watch -------------------------------------------------------------------------


@MODES
def test_dropout_without_rng_preservation_is_reported_and_the_fix_restores_the_gradients(deep: bool) -> None:
    torch.manual_seed(0)
    model, x = FeedForward(preserve_rng_state=False), torch.randn(4, 8)
    with _watch(deep) as session:
        torch.manual_seed(1)
        model(x).pow(2).sum().backward()
    [finding] = _ipd111(session.findings)
    assert finding.mutation.op == "aten.bernoulli_" and finding.mutation.module == "model.drop"
    assert finding.cause is RecomputeCause.RNG and "preserve_rng_state=False" in finding.why
    assert "preserve_rng_state=True" in finding.fix
    reference = FeedForward(None)
    reference.load_state_dict(model.state_dict())
    expected = _grads(reference, x)
    assert any(not torch.equal(a, b) for a, b in zip(_grads(model, x), expected))  # the bug is real
    model.preserve = True  # the printed fix
    with _watch(deep) as session:
        fixed = _grads(model, x)
    assert _ipd111(session.findings) == []
    assert all(torch.equal(a, b) for a, b in zip(fixed, expected))


@MODES
def test_dropout_with_rng_preservation_reports_nothing(deep: bool) -> None:
    torch.manual_seed(0)
    model = FeedForward(preserve_rng_state=True)
    with _watch(deep) as session:
        for _ in range(2):
            model(torch.randn(4, 8)).sum().backward()
    assert _ipd111(session.findings) == []


@MODES
def test_the_fused_dropout_kernel_draws_random_numbers_too(deep: bool) -> None:
    """Dropout on CUDA in training is `aten.native_dropout`, whose schema takes no Generator (CPU's
    `bernoulli_` takes one): its recompute's other mask is the RNG's doing, not an unknown change
    (which on CUDA would be taken for rounding). Called by name here, where dropout decomposes otherwise."""
    def block(x: torch.Tensor) -> torch.Tensor:
        return torch.native_dropout(x * 2, 0.5, True)[0]

    x = torch.randn(64, requires_grad=True)
    with _watch(deep) as session:
        checkpoint(block, x, use_reentrant=False, preserve_rng_state=False).pow(2).sum().backward()
    [finding] = _ipd111(session.findings)
    assert finding.mutation.op == "aten.native_dropout" and finding.cause is RecomputeCause.RNG
    assert "preserve_rng_state=True" in finding.fix


class Tempered(nn.Module):
    def __init__(self, checkpointed: bool = True) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("temperature", torch.tensor(2.0))
        self.checkpointed = checkpointed

    def block(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc(x) / self.temperature, dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, x, use_reentrant=False) if self.checkpointed else self.block(x)


@MODES
def test_state_written_between_forward_and_backward_names_the_write_and_the_fix_restores_the_gradients(deep: bool) -> None:
    torch.manual_seed(0)
    model, x = Tempered(), torch.randn(3, 8)
    with _watch(deep) as session:
        loss = model(x).pow(2).sum()
        model.temperature.mul_(0.5)  # the write the finding names
        loss.backward()
    [finding] = _ipd111(session.findings)
    assert finding.mutation.op == "aten.div" and finding.cause is RecomputeCause.STATE
    assert "model.temperature" in finding.why and "`mul_`" in finding.why
    assert "after backward()" in finding.fix

    def run(checkpointed: bool, anneal_before_backward: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        m = Tempered(checkpointed)
        loss = m(x).pow(2).sum()
        if anneal_before_backward:
            m.temperature.mul_(0.5)
        loss.backward()
        if not anneal_before_backward:
            m.temperature.mul_(0.5)  # the fix: after backward
        return [p.grad for p in m.parameters()]

    expected = run(checkpointed=False, anneal_before_backward=False)
    assert any(not torch.equal(a, b) for a, b in zip(run(True, True), expected))  # silently other gradients
    with _watch(deep) as session:
        fixed = run(True, False)
    assert _ipd111(session.findings) == []
    assert all(torch.equal(a, b) for a, b in zip(fixed, expected))


@MODES
def test_an_optimizer_step_between_two_backwards_of_a_retained_graph_is_reported_at_the_second(deep: bool) -> None:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
    opt = torch.optim.SGD(block.parameters(), lr=0.1)
    x = torch.randn(4, 8, requires_grad=True)
    with _watch(deep, block=block) as session:
        out = checkpoint(block, x, use_reentrant=False)
        out.pow(2).mean().backward(retain_graph=True)
        assert _ipd111(session.findings) == []  # the first recompute matches its forward
        opt.step()
        out.abs().mean().backward()
    [finding] = _ipd111(session.findings)
    assert finding.mutation.op == "aten.addmm" and "SGD.step" in finding.why


@MODES
def test_ops_outside_checkpoint_regions_are_not_fingerprinted(deep: bool) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))
    session = _watch(deep)
    with session:
        model(torch.randn(2, 8)).sum().backward()
    recompute = session.tracer._recompute
    assert recompute is not None and not recompute.watched and len(recompute._regions) == 0
    if not deep:  # no op entered Python but the writes: the per-op mode never turned on
        assert session.tracer.checkpoint_ops.regions == 0 and session.tracer.checkpoint_ops.mode.ops == 0


# -- audit and run -------------------------------------------------------------------


def test_audit_reports_dropout_without_rng_preservation_and_not_with_it() -> None:
    torch.manual_seed(0)
    report = ipd.audit(FeedForward(preserve_rng_state=False), torch.randn(4, 8))
    assert [f.mutation.op for f in _ipd111(report.findings)] == ["aten.bernoulli_"]
    assert _ipd111(ipd.audit(FeedForward(preserve_rng_state=True), torch.randn(4, 8)).findings) == []


@pytest.mark.parametrize(
    "fixture, reported",
    [("flagged/dropout_rng_not_preserved.py", True), ("flagged/scale_annealed_before_backward.py", True),
     ("clean/dropout_rng_preserved.py", False)],
)
def test_run_on_a_script(fixture: str, reported: bool) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "inplace_doctor", "run", str(FIXTURES / fixture)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "NO_COLOR": "1"},
    )
    assert ("IPD111" in done.stderr) is reported, done.stderr
    assert done.returncode == (1 if reported else 0), done.stderr


# -- real models -------------------------------------------------------------------


@MODES
def test_a_hugging_face_model_with_gradient_checkpointing_reports_nothing(deep: bool) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=16, bos_token_id=0, eos_token_id=0,
        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
    )
    model = transformers.GPT2LMHeadModel(config)
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids = torch.randint(0, 100, (2, 8))
    session = _watch(deep, model=model)
    with session:
        model(input_ids=ids, labels=ids).loss.backward()
    assert session.tracer._recompute.compared > 20  # both layers' recomputes were compared, op by op
    assert _ipd111(session.findings) == []


@MODES
def test_the_region_count_is_undone_when_watch_ends(deep: bool) -> None:
    import torch.utils.checkpoint as torch_checkpoint
    from torch.autograd.function import BackwardCFunction

    apply = BackwardCFunction.__dict__["apply"]
    with _watch(deep):
        assert "__enter__" in torch_checkpoint._checkpoint_hook.__dict__
        # the fast tracer's reentrant recompute seen through a Function's backward, while it runs
        assert (BackwardCFunction.__dict__["apply"] is apply) is deep
    for hook_class in (torch_checkpoint._checkpoint_hook, torch_checkpoint._recomputation_hook):
        assert "__enter__" not in hook_class.__dict__ and "__exit__" not in hook_class.__dict__
    assert BackwardCFunction.__dict__["apply"] is apply
    assert RegionCount.watchers == [] and torch._C._len_torch_dispatch_stack() == 0


@MODES
def test_ignoring_ipd111_switches_the_check_and_its_cost_off(deep: bool) -> None:
    session = _watch(deep, ignore="IPD111")
    assert session.tracer._recompute is None
    with session:
        FeedForward(preserve_rng_state=False)(torch.randn(4, 8)).sum().backward()
    assert _ipd111(session.findings) == []


class _Recorder(list):
    def __call__(self, event):
        self.append(event)


def _unseen_change_event():
    """A region whose parameter is changed through NumPy between forward and backward: no write
    the tracer sees, no version bump, so the recompute's difference has no cause it can name."""
    from inplace_doctor.events import CheckpointRecomputeDiffers
    from inplace_doctor.trace.tracer import Tracer

    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    events = _Recorder()
    with Tracer(events):
        y = checkpoint(lambda t: torch.tanh(lin(t)), x, use_reentrant=False)
        with torch.no_grad():
            lin.weight.detach().numpy()[0, 0] += 1.0  # a change PyTorch and the tracer do not see
        y.sum().backward()
    [event] = [e for e in events if isinstance(e, CheckpointRecomputeDiffers)]
    return event


def test_an_unexplained_difference_on_cpu_is_an_error_and_on_an_accelerator_a_warning_that_says_how_to_tell() -> None:
    """On CPU, recomputing with the same inputs is deterministic, so a difference with no cause the
    tracer sees is a real change: an error. On an accelerator with nondeterministic algorithms
    allowed, atomics may differ in the last bits: then it is a warning that says how to tell the two
    apart. (No GPU here: the device flag is set on the CPU run's event to check the rule's answer;
    the flag itself is the CPU run's, False.)"""
    import dataclasses

    from inplace_doctor.rules.checkpoint_recompute import checkpoint_recompute_differs

    class Ctx:
        root_label = "model"

    event = _unseen_change_event()
    assert event.nondeterministic_kernels is False
    assert event.changed_by is None and not event.input_version_changed and not event.random
    on_cpu = checkpoint_recompute_differs(event, Ctx())
    assert on_cpu.severity is ipd.Severity.ERROR
    on_gpu = checkpoint_recompute_differs(dataclasses.replace(event, nondeterministic_kernels=True), Ctx())
    assert on_gpu.severity is ipd.Severity.WARNING
    assert "differ in the last bits" in on_gpu.why and "Not certain either way" in on_gpu.why
    assert on_gpu.fix.startswith("run once with torch.use_deterministic_algorithms(True)")
