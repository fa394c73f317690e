"""What `audit`, `verify` and `optimize` leave behind, probed where test_restore.py does not go.

test_restore.py checks `audit` aspect by aspect on small models. Here: the same promise for
`verify` and `optimize` (they run on copies, but read the caller's inputs and RNG), on models
that combine what makes restoring hard (tied parameters, non-persistent buffers, cumulative
BatchNorm, frozen parameters with a `.grad`, a module in eval inside a training model, the
user's own hooks); inputs inside dataclasses and views of larger tensors; the user's own
`torch.Generator`s; tensors a module keeps as plain attributes (caches, counters); process-wide
settings the caller chose (grad mode, autocast, default dtype, threads); errors and
KeyboardInterrupt midway; and, with weak references, that no tensor of the run stays alive.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import random
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_globals

import inplace_doctor as ipd

np = pytest.importorskip("numpy")

Verb = Callable[..., Any]


def _optimize(model: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return ipd.optimize(model, *args, steps=1, suggest_checkpoint=False, **kwargs)


VERBS: dict[str, Verb] = {"audit": ipd.audit, "verify": ipd.verify, "optimize": _optimize}


# --------------------------------------------------------------------------
# a model that combines what is hard to restore
# --------------------------------------------------------------------------


class Tangle(nn.Module):
    """Tied weights, a frozen layer, cumulative BatchNorm, a non-persistent buffer forward counts
    in, an in-place ReLU, a Dropout in eval inside a training model, and its own hooks."""

    calls: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 8, bias=False)
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.bn = nn.BatchNorm1d(8, momentum=None)
        self.act = nn.ReLU(inplace=True)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(8, 8, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("calls", torch.zeros((), dtype=torch.long), persistent=False)
        self.seen_by_hooks: list[str] = []
        self.register_forward_pre_hook(lambda m, args: self.seen_by_hooks.append("pre"))
        self.act.register_forward_hook(lambda m, args, out: self.seen_by_hooks.append("post"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        h = self.act(self.bn(self.frozen(self.embed(x))))
        return self.head(self.drop(h))


def tangle() -> Tangle:
    torch.manual_seed(0)
    model = Tangle().train()
    model.drop.eval()
    model.embed.weight.grad = torch.randn(8, 8)  # an existing .grad, shared by the tied head
    model.frozen.weight.grad = torch.randn(8, 8)  # a frozen parameter that still holds one
    return model


@dataclasses.dataclass
class Snapshot:
    """Everything of a model and its input that a verb must leave as found."""

    tensors: list[tuple[str, torch.Tensor, torch.Tensor, int]]  # name, object, value, version
    grads: list[tuple[str, torch.Tensor, torch.Tensor | None, torch.Tensor | None]]
    requires_grad: list[tuple[str, bool]]
    training: list[tuple[str, bool]]
    inplace: list[tuple[str, Any]]
    hooks: list[tuple[str, tuple[Any, ...]]]
    rng: tuple[torch.Tensor, Any, Any]

    @classmethod
    def take(cls, model: nn.Module, inputs: list[torch.Tensor]) -> Snapshot:
        named = [(f"param {n}", p) for n, p in model.named_parameters(remove_duplicate=False)]
        named += [(f"buffer {n}", b) for n, b in model.named_buffers(remove_duplicate=False)]
        named += [(f"input {i}", t) for i, t in enumerate(inputs)]
        return cls(
            tensors=[(n, t, t.detach().clone(), t._version) for n, t in named],
            grads=[(n, t, t.grad, None if t.grad is None else t.grad.clone()) for n, t in named],
            requires_grad=[(n, t.requires_grad) for n, t in named],
            training=[(n, m.training) for n, m in model.named_modules()],
            inplace=[(n, m.__dict__.get("inplace")) for n, m in model.named_modules()],
            hooks=[(n, tuple(m._forward_pre_hooks) + tuple(m._forward_hooks)) for n, m in model.named_modules()],
            rng=(torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()),
        )

    def assert_same(self, model: nn.Module, inputs: list[torch.Tensor]) -> None:
        again = Snapshot.take(model, inputs)
        for (name, t, value, version), (_, now, _, now_version) in zip(self.tensors, again.tensors, strict=True):
            assert now is t, f"{name} was replaced"
            assert torch.equal(now, value), f"{name} changed value"
            assert now_version == version, f"{name}: _version {version} -> {now_version}"
        for (name, _, grad, value), (_, _, now, _) in zip(self.grads, again.grads, strict=True):
            assert now is grad, f"{name}: .grad {'None became a tensor' if grad is None else 'was replaced'}"
            assert value is None or torch.equal(now, value), f"{name}: .grad changed value"
        assert again.requires_grad == self.requires_grad
        assert again.training == self.training
        assert again.inplace == self.inplace
        assert again.hooks == self.hooks
        assert torch.equal(again.rng[0], self.rng[0]), "torch RNG state changed"
        assert again.rng[1] == self.rng[1], "Python random state changed"
        assert np.array_equal(again.rng[2], self.rng[2]), "numpy RNG state changed"


@pytest.mark.parametrize("verb", list(VERBS))
def test_every_verb_leaves_a_tangled_model_and_its_input_as_found(verb: str) -> None:
    model, x = tangle(), torch.randn(6, 8)
    # meaningful: the same step outside the tool changes the buffers and the grads
    plain = tangle()
    plain(x.clone()).sum().backward()
    assert int(plain.calls) == 1 and not torch.equal(plain.bn.running_var, model.bn.running_var)
    assert not torch.equal(plain.embed.weight.grad, model.embed.weight.grad)
    torch.manual_seed(7)
    before = Snapshot.take(model, [x])
    VERBS[verb](model, x)
    before.assert_same(model, [x])
    assert model.head.weight is model.embed.weight  # still tied
    assert "calls" in model._non_persistent_buffers_set


@pytest.mark.parametrize("verb", list(VERBS))
def test_every_verb_leaves_the_user_s_global_hooks_and_calls_them_as_forward_would(verb: str) -> None:
    model, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU()), torch.randn(2, 8)
    calls: list[str] = []
    handle = module_globals.register_module_forward_hook(lambda m, args, out: calls.append(type(m).__name__))
    try:
        keys = tuple(module_globals._global_forward_hooks)
        VERBS[verb](model, x)
        assert tuple(module_globals._global_forward_hooks) == keys
        assert calls and set(calls) == {"Sequential", "Linear", "ReLU"}
    finally:
        handle.remove()


# --------------------------------------------------------------------------
# inputs: dataclasses, views of a larger tensor, hooks that write them
# --------------------------------------------------------------------------


@dataclasses.dataclass
class Batch:
    features: torch.Tensor
    weights: torch.Tensor


@dataclasses.dataclass(frozen=True)
class FrozenBatch:
    features: torch.Tensor
    weights: torch.Tensor


class WeighsInPlace(nn.Module):
    """Normalises the batch's weights in place (a data-loading shortcut), then a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, batch: Any) -> torch.Tensor:
        batch.weights.div_(batch.weights.sum())
        return (self.fc(batch.features) * batch.weights[:, None]).sum()


@pytest.mark.parametrize("kind", [Batch, FrozenBatch], ids=["dataclass", "frozen-dataclass"])
def test_audit_restores_tensors_inside_a_dataclass_input(kind: type) -> None:
    torch.manual_seed(0)
    model, features, weights = WeighsInPlace(), torch.randn(4, 8, requires_grad=True), torch.rand(4) + 0.5
    before = Snapshot.take(nn.Module(), [features, weights])
    report = ipd.audit(model, kind(features, weights))
    assert report.backward
    [finding] = [f for f in report.findings if f.code == "IPD106"]  # the write to the caller's batch, found
    assert "args[0].weights" in finding.message
    # values and versions back, and the leaf's `.grad` still None: backward reached it through the dataclass
    before.assert_same(nn.Module(), [features, weights])


def test_audit_keeps_an_existing_grad_of_a_leaf_inside_a_dataclass() -> None:
    torch.manual_seed(0)
    features = torch.randn(4, 8, requires_grad=True)
    grad = torch.ones(4, 8)
    features.grad = grad
    ipd.audit(WeighsInPlace(), Batch(features, torch.rand(4) + 0.5))
    assert features.grad is grad and torch.equal(grad, torch.ones(4, 8))


def test_verify_does_not_write_the_caller_s_dataclass_input() -> None:
    torch.manual_seed(0)
    batch = Batch(torch.randn(4, 8), torch.rand(4) + 0.5)
    weights, value, version = batch.weights, batch.weights.clone(), batch.weights._version
    result = ipd.verify(WeighsInPlace(), batch)
    assert result.equivalent, result
    assert batch.weights is weights and torch.equal(weights, value) and weights._version == version


class ScalesInPreHook(nn.Module):
    """A forward pre-hook of the user's that scales the input in place before forward sees it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 2)
        self.register_forward_pre_hook(lambda m, args: args[0].mul_(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


@pytest.mark.parametrize("verb", list(VERBS))
def test_an_input_that_is_a_view_of_a_larger_tensor_keeps_the_whole_tensor(verb: str) -> None:
    torch.manual_seed(0)
    model, whole = ScalesInPreHook(), torch.randn(10, 8)
    x = whole[2:8]
    before = Snapshot.take(nn.Module(), [whole])
    VERBS[verb](model, x)
    before.assert_same(nn.Module(), [whole])  # the rows outside the view too; and the version


def test_audit_of_a_view_of_a_leaf_that_requires_grad_leaves_the_leaf_as_found() -> None:
    torch.manual_seed(0)
    model, leaf = ScalesInPreHook(), torch.randn(10, 8, requires_grad=True)
    before = Snapshot.take(nn.Module(), [leaf])
    report = ipd.audit(model, leaf[2:8])  # PyTorch refuses the write: reported
    assert report.findings
    before.assert_same(nn.Module(), [leaf])


# --------------------------------------------------------------------------
# the user's own torch.Generator
# --------------------------------------------------------------------------


class NoisyWithGenerator(nn.Module):
    """Draws its noise from a generator it owns (reproducible augmentation), or from one passed in."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.generator = torch.Generator().manual_seed(5)

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        noise = torch.rand(x.shape, generator=generator or self.generator)
        return self.fc(x) * noise


@pytest.mark.parametrize("verb", list(VERBS))
def test_a_generator_the_model_owns_is_left_where_it_was(verb: str) -> None:
    model = NoisyWithGenerator()
    state = model.generator.get_state()
    VERBS[verb](model, torch.randn(2, 8))
    assert torch.equal(model.generator.get_state(), state)


@pytest.mark.parametrize("verb", list(VERBS))
def test_a_generator_passed_as_an_input_is_left_where_it_was(verb: str) -> None:
    generator = torch.Generator().manual_seed(3)
    state = generator.get_state()
    VERBS[verb](NoisyWithGenerator(), torch.randn(2, 8), generator=generator)
    assert torch.equal(generator.get_state(), state)


def test_verify_runs_both_programs_on_the_same_stream_of_a_generator_passed_in() -> None:
    # the two runs draw the same noise: a shared generator would give each different noise
    result = ipd.verify(NoisyWithGenerator(), torch.randn(2, 8), generator=torch.Generator().manual_seed(3))
    assert result.equivalent, result


# --------------------------------------------------------------------------
# tensors a module keeps as plain attributes
# --------------------------------------------------------------------------


class KeepsCaches(nn.Module):
    """A running sum written in place, a cache rebound to a longer tensor, the last activation
    stored (it holds the run's graph), and a scale the author forgot to make a Parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.running = torch.zeros(8)
        self.cache = torch.zeros(0, 8)
        self.last: torch.Tensor | None = None
        self.scale = torch.ones(8, requires_grad=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x) * self.scale
        self.running.add_(h.detach().sum(0))
        self.cache = torch.cat([self.cache, h.detach()])
        self.last = h
        self.stashed = [h]  # added by forward
        return h


@pytest.mark.parametrize("verb", list(VERBS))
def test_tensors_kept_as_plain_attributes_are_left_as_found(verb: str) -> None:
    torch.manual_seed(0)
    model = KeepsCaches()
    running, cache, scale = model.running, model.cache, model.scale
    VERBS[verb](model, torch.randn(4, 8))
    assert model.running is running and torch.equal(running, torch.zeros(8))
    assert model.cache is cache and model.last is None and not hasattr(model, "stashed")
    assert model.scale is scale and scale.grad is None  # backward reached it: no .grad left


def test_no_tensor_of_audit_s_run_stays_alive_through_a_plain_attribute() -> None:
    torch.manual_seed(0)
    model = KeepsCaches()
    refs: list[weakref.ref[torch.Tensor]] = []
    model.fc.register_forward_hook(lambda m, args, out: refs.append(weakref.ref(out)))
    ipd.audit(model, torch.randn(4, 8))
    gc.collect()
    assert refs and all(r() is None for r in refs)


# --------------------------------------------------------------------------
# the caller's process-wide settings
# --------------------------------------------------------------------------


@pytest.fixture
def unusual_settings() -> Iterator[Callable[[], tuple[Any, ...]]]:
    """Settings a caller may have chosen, none the default; given back after the test."""

    def settings() -> tuple[Any, ...]:
        return (
            torch.is_grad_enabled(), torch.get_default_dtype(), torch.get_num_threads(),
            torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark,
            torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), torch.is_anomaly_enabled(),
        )

    found = settings()
    threads = torch.get_num_threads()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = not found[4]
    try:
        yield settings
    finally:
        torch.set_default_dtype(found[1])
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(found[3])
        torch.backends.cudnn.benchmark = found[4]


@pytest.mark.parametrize("verb", list(VERBS))
def test_every_verb_leaves_the_caller_s_settings(verb: str, unusual_settings: Callable[[], tuple[Any, ...]]) -> None:
    model, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 2)), torch.randn(2, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.set_detect_anomaly(True, check_nan=False):
        chosen = unusual_settings()
        VERBS[verb](model, x)
        assert unusual_settings() == chosen
    with torch.no_grad():
        if verb == "optimize":  # it measures backward: refused, saying why
            with pytest.raises(ipd.UsageError, match=r"grad mode is off \(called inside torch.no_grad\(\)\)"):
                VERBS[verb](model, x)
        else:
            VERBS[verb](model, x)
        assert not torch.is_grad_enabled()


def test_audit_under_inference_mode_stays_in_it_and_says_why_backward_did_not_run() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True))
    with torch.inference_mode():
        report = ipd.audit(model, torch.randn(2, 8))
        assert torch.is_inference_mode_enabled()
    assert not report.backward
    assert "grad mode is off (called inside torch.inference_mode())" in " ".join(report.notes)
    assert all(p.grad is None for p in model.parameters())


# --------------------------------------------------------------------------
# errors and interrupts midway
# --------------------------------------------------------------------------


class FailsAfterWork(nn.Module):
    """Counts, runs BatchNorm and Dropout, draws from every RNG, writes its input, then fails in
    forward or, through a gradient hook, in backward."""

    calls: torch.Tensor

    def __init__(self, error: BaseException, where: str) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(inplace=True), nn.Dropout(0.5))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.error, self.where = error, where

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        h = self.body(x)
        x.mul_(2)
        random.random()
        np.random.rand()
        kind, args = type(self.error), self.error.args  # a new exception each time, as user code raises
        if self.where == "forward":
            raise kind(*args)

        def fail(grad: torch.Tensor) -> torch.Tensor:
            raise kind(*args)

        h.register_hook(fail)
        return h


@pytest.mark.parametrize("where", ["forward", "backward"])
@pytest.mark.parametrize("error", [ValueError("bad batch"), KeyboardInterrupt()], ids=["ValueError", "KeyboardInterrupt"])
@pytest.mark.parametrize("verb", list(VERBS))
def test_everything_is_restored_when_the_model_fails_midway(verb: str, error: BaseException, where: str) -> None:
    torch.manual_seed(0)
    model, x = FailsAfterWork(error, where).train(), torch.randn(6, 8)
    model.body[0].weight.grad = torch.randn(8, 8)
    before = Snapshot.take(model, [x])
    with pytest.raises(BaseException) as info:
        VERBS[verb](model, x)
    # the user's error, re-raised: as it is (verify and optimize raise the one of their copy of
    # the model), or as audit's ModelError chained to it, saying where the model stopped
    raised = info.value.__cause__ if isinstance(info.value, ipd.ModelError) else info.value
    assert type(raised) is type(error) and raised.args == error.args
    if isinstance(info.value, ipd.ModelError):
        assert f"during {where}" in str(info.value) and "bad batch" in str(info.value)
    before.assert_same(model, [x])


@pytest.mark.parametrize("verb", list(VERBS))
def test_no_tensor_of_the_run_stays_alive_after_a_failure(verb: str) -> None:
    refs: list[weakref.ref[torch.Tensor]] = []

    def run() -> None:
        torch.manual_seed(0)
        model = FailsAfterWork(ValueError("bad batch"), "backward")
        model.body.register_forward_hook(lambda m, args, out: refs.append(weakref.ref(out)))
        with pytest.raises((ValueError, ipd.ModelError)):
            VERBS[verb](model, torch.randn(6, 8))

    run()
    gc.collect()
    assert refs and all(r() is None for r in refs), f"{sum(r() is not None for r in refs)} of {len(refs)} alive"


# --------------------------------------------------------------------------
# the caller's own graph, built before the call, still runs after it
# --------------------------------------------------------------------------


class ClipsAndScales(nn.Module):
    """Clips its weight in place under no_grad (weight clipping) and scales its input in place."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.fc.weight.clamp_(-0.1, 0.1)
        x.mul_(2)
        return self.fc(x)


def test_audit_between_the_caller_s_forward_and_backward_changes_nothing_backward_sees() -> None:
    # the caller's graph saved the weight (for the input's grad) and the input (for the output's);
    # audit writes both and puts their bytes back: their versions must come back too

    def caller_step(model: nn.Module, x: torch.Tensor, between: Callable[[], Any]) -> list[torch.Tensor]:
        scale = torch.ones(8, requires_grad=True)
        out = model.fc(x * scale) * x
        between()
        out.sum().backward()  # raised "modified by an inplace operation" when versions stayed moved
        assert scale.grad is not None
        return [scale.grad, *(p.grad for p in model.parameters() if p.grad is not None)]

    torch.manual_seed(0)
    model, x = ClipsAndScales(), torch.randn(4, 8)
    plain = caller_step(copy.deepcopy(model), x.clone(), lambda: None)
    reports: list[Any] = []
    audited = caller_step(model, x, lambda: reports.append(ipd.audit(model, x)))
    assert "IPD106" in reports[0].codes  # the write to the caller's input is reported
    assert len(plain) == len(audited) == 3
    assert all(torch.equal(a, b) for a, b in zip(plain, audited))


# --------------------------------------------------------------------------
# a non-leaf input (features from an upstream model), and outputs in a dataclass
# --------------------------------------------------------------------------


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 2)
        self.act = nn.ReLU(inplace=True)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(self.act(features * 1))


@pytest.mark.parametrize("verb", [*VERBS, "memory"])
def test_a_non_leaf_input_is_accepted_and_its_graph_left_alone(verb: str) -> None:
    torch.manual_seed(0)
    backbone, head = nn.Linear(8, 8), Head()
    features = backbone(torch.randn(4, 8))
    grad_fn, version = features.grad_fn, features._version
    getattr(ipd, verb)(head, features)  # deepcopy refused a non-leaf; verify made it a leaf
    assert features.grad_fn is grad_fn and features._version == version
    assert backbone.weight.grad is None
    features.sum().backward()  # the caller's graph was not run through, nor freed
    assert backbone.bias.grad is not None and torch.equal(backbone.bias.grad, torch.full((8,), 4.0))


class WritesItsFeatures(Head):
    def forward(self, features: torch.Tensor) -> torch.Tensor:
        features.mul_(2)  # legal on a non-leaf: the caller's features change
        return self.fc(features)


def test_verify_of_a_model_that_writes_its_non_leaf_input_runs_it_as_the_program_does() -> None:
    torch.manual_seed(0)
    features = nn.Linear(8, 8)(torch.randn(4, 8))
    result = ipd.verify(WritesItsFeatures(), features)  # raised PyTorch's leaf error: the copy was a leaf
    assert result.equivalent and result.error is None, result


@pytest.mark.xfail(strict=True, reason="verify (steps > 1), memory and optimize step several times on one copy of "
                   "the inputs: the second backward runs through the first step's write to the non-leaf input, whose "
                   "graph is freed (a real loop passes new features each step; a fresh copy per step is needed)")
@pytest.mark.parametrize("run", [
    pytest.param(lambda model, x: ipd.verify(model, x, steps=2), id="verify-2-steps"),
    pytest.param(_optimize, id="optimize"),
])
def test_several_steps_of_a_model_that_writes_its_non_leaf_input(run: Verb) -> None:
    torch.manual_seed(0)
    features = nn.Linear(8, 8)(torch.randn(4, 8))
    run(WritesItsFeatures(), features)


@dataclasses.dataclass
class Prediction:
    logits: torch.Tensor
    label: str


class PredictsDataclass(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> Prediction:
        return Prediction(torch.sigmoid(self.fc(x)).relu_(), "cat")


def test_audit_runs_backward_through_an_output_in_a_dataclass() -> None:
    torch.manual_seed(0)
    model = PredictsDataclass()
    report = ipd.audit(model, torch.randn(4, 8))
    assert report.backward  # "no output requires grad" before: the dataclass was not looked into
    assert "IPD101" in report.codes
    [finding] = [f for f in report.findings if f.code == "IPD101"]
    assert finding.confirmed is True
    assert all(p.grad is None for p in model.parameters())


# --------------------------------------------------------------------------
# the caller's optimizer and scheduler
# --------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["verify", "optimize", "memory"])
def test_the_caller_s_optimizer_and_scheduler_are_not_stepped(verb: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    scheduler.step()  # state to keep: Adam's moments, the step count, a decayed lr
    state, params = copy.deepcopy(opt.state_dict()), [list(g["params"]) for g in opt.param_groups]
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    schedule, x = scheduler.state_dict(), torch.randn(4, 8)
    before = Snapshot.take(model, [x])
    run = {"optimize": _optimize, "verify": ipd.verify, "memory": ipd.memory}[verb]
    run(model, x, optimizer=opt)
    now = opt.state_dict()
    assert now["state"].keys() == state["state"].keys()
    for key, values in state["state"].items():
        assert all(torch.equal(now["state"][key][name], value) for name, value in values.items())
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == groups
    assert all(p is q for g, old in zip(opt.param_groups, params, strict=True) for p, q in zip(g["params"], old, strict=True))
    assert scheduler.state_dict() == schedule
    before.assert_same(model, [x])


def test_inputs_copied_under_no_grad_keep_what_autograd_sees() -> None:
    # `run --verify` records each model call's inputs under no_grad, to verify them later
    from inplace_doctor.engines.preserve import private_copy

    leaf = torch.randn(4, 8, requires_grad=True)
    features = leaf * 2
    with torch.no_grad():
        copied_leaf, copied_features = private_copy((leaf, features))
    assert copied_leaf.is_leaf and copied_leaf.requires_grad and copied_leaf is not leaf
    assert copied_features.requires_grad and not copied_features.is_leaf
    assert copied_features.untyped_storage().data_ptr() != features.untyped_storage().data_ptr()
    assert torch.equal(copied_leaf, leaf) and torch.equal(copied_features, features)


def test_old_style_spectral_norm_gets_its_weight_attribute_and_power_iteration_back() -> None:
    # torch.nn.utils.spectral_norm: a pre-hook writes `weight_u` in place and rebinds the plain
    # attribute `weight` to a tensor computed in the run (it holds the run's graph)
    torch.manual_seed(0)
    model = nn.Sequential(nn.utils.spectral_norm(nn.Linear(8, 8)), nn.ReLU(), nn.Linear(8, 2)).train()
    weight, x = model[0].weight, torch.randn(4, 8)
    assert "weight" in vars(model[0])  # a plain attribute, not a parameter
    before = Snapshot.take(model, [x])
    ipd.audit(model, x)
    before.assert_same(model, [x])
    assert model[0].weight is weight
