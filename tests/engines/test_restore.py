"""`audit` leaves everything exactly as it found it; `watch` changes nothing the user's code would not.

The contract (api.audit's docstring): parameters, buffers (running stats,
`num_batches_tracked`), `.grad` (None stays None), train/eval flags, the
global RNG state and the caller's inputs are left as found, also when the
model raises or backward hits an in-place error, and no tensor is kept alive.

Each aspect is tested on its own, on small real models. Known bugs are
written as the correct behaviour and marked `xfail(strict=True)`.
"""

from __future__ import annotations

import collections
import copy
import gc
import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import inplace_doctor as ipd
from inplace_doctor import Severity

np = pytest.importorskip("numpy")


# --------------------------------------------------------------------------
# small models
# --------------------------------------------------------------------------


def mlp() -> nn.Sequential:
    """Linear, BatchNorm1d (running stats), in-place ReLU, Dropout, Linear."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(inplace=True), nn.Dropout(0.5), nn.Linear(16, 4)
    ).train()


def convnet() -> nn.Sequential:
    """Conv2d, BatchNorm2d, in-place ReLU, Dropout2d, pooling, Linear."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(inplace=True), nn.Dropout2d(0.5),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2),
    ).train()


def mlp_input() -> torch.Tensor:
    return torch.randn(6, 8)


def conv_input() -> torch.Tensor:
    return torch.randn(2, 3, 8, 8)


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], torch.Tensor]]] = {
    "linear": (lambda: nn.Linear(8, 3), mlp_input),
    "mlp": (mlp, mlp_input),
    "convnet": (convnet, conv_input),
}


class SigmoidReluHead(nn.Module):
    """sigmoid then relu_: backward raises at SigmoidBackward (IPD101). The layer
    after it accumulates its gradients before backward reaches the error."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.drop(self.bn(self.fc(x))))
        return self.out(torch.relu_(gate))


class CountingModule(nn.Module):
    """A buffer updated in place by an ordinary (dispatch-visible) op."""

    calls: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.fc(x)


class EmaModule(nn.Module):
    """A buffer reassigned (not written) in forward."""

    ema: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("ema", torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        self.ema = 0.9 * self.ema + 0.1 * h.detach().mean(0)
        return h


# --------------------------------------------------------------------------
# snapshots
# --------------------------------------------------------------------------


def params_of(model: nn.Module) -> list[tuple[str, torch.Tensor, torch.Tensor, int]]:
    return [(n, p, p.detach().clone(), p._version) for n, p in model.named_parameters()]


def assert_params_unchanged(model: nn.Module, before: list[tuple[str, torch.Tensor, torch.Tensor, int]],
                            check_version: bool = True) -> None:
    now = dict(model.named_parameters())
    assert list(now) == [n for n, *_ in before]
    for name, p, value, version in before:
        assert now[name] is p, f"parameter {name} was replaced"
        assert torch.equal(p, value), f"parameter {name} changed value"
        if check_version:
            assert p._version == version, f"parameter {name}: _version {version} -> {p._version}"


def buffers_of(model: nn.Module) -> list[tuple[nn.Module, str, torch.Tensor, torch.Tensor, int]]:
    return [
        (m, n, b, b.clone(), b._version)
        for m in model.modules()
        for n, b in m._buffers.items()
        if b is not None
    ]


def assert_buffers_unchanged(before: list[tuple[nn.Module, str, torch.Tensor, torch.Tensor, int]]) -> None:
    for module, name, buf, value, version in before:
        now = module._buffers[name]
        assert now is buf, f"{type(module).__name__}.{name} was replaced"
        assert torch.equal(now, value), f"{type(module).__name__}.{name} changed value"
        assert now._version == version, f"{type(module).__name__}.{name}: _version {version} -> {now._version}"


def grads_of(tensors: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, int]]:
    out = []
    for t in tensors:
        g = t.grad
        out.append((t, g, None if g is None else g.clone(), -1 if g is None else g._version))
    return out


def assert_grads_unchanged(before: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, int]]) -> None:
    for i, (t, g, value, version) in enumerate(before):
        if g is None:
            assert t.grad is None, f"tensor {i}: .grad None became a tensor"
        else:
            assert t.grad is g and g is not None and value is not None, f"tensor {i}: .grad was replaced"
            assert torch.equal(g, value), f"tensor {i}: .grad changed value (accumulated into?)"
            assert g._version == version, f"tensor {i}: .grad written in place"


def flags_of(model: nn.Module) -> list[tuple[str, bool]]:
    return [(n, m.training) for n, m in model.named_modules()]


class RngSnapshot:
    def __init__(self) -> None:
        self.torch = torch.get_rng_state()
        self.python = random.getstate()
        self.numpy = np.random.get_state()

    def assert_unchanged(self) -> None:
        assert torch.equal(torch.get_rng_state(), self.torch), "torch RNG state changed"
        assert random.getstate() == self.python, "Python random state changed"
        now = np.random.get_state()
        assert now[0] == self.numpy[0] and np.array_equal(now[1], self.numpy[1]), "numpy RNG state changed"
        assert tuple(now[2:]) == tuple(self.numpy[2:]), "numpy RNG state changed"


def live_tensors() -> int:
    """Live torch.Tensor objects (parameters included) after a full collection."""
    # Freeing one cycle can release C++-held objects that form the next: collect until nothing is left.
    for _ in range(10):
        if not gc.collect():
            break
    # issubclass(type(o)) rather than isinstance: some deprecated torch objects warn on __class__.
    return sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor))


def set_grads(model: nn.Module, every: int = 2) -> None:
    """Give every `every`-th parameter an existing .grad, leave the others None."""
    for i, p in enumerate(model.parameters()):
        if i % every == 0:
            p.grad = torch.randn_like(p)


# --------------------------------------------------------------------------
# parameters
# --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(MODELS))
def test_parameters_unchanged(kind: str) -> None:
    make_model, make_input = MODELS[kind]
    model, x = make_model(), make_input()
    before = params_of(model)
    ipd.audit(model, x)
    assert_params_unchanged(model, before)


class ClipsItsWeight(nn.Module):
    """Writes its own parameter in place (under no_grad) in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.fc.weight.clamp_(-0.05, 0.05)
        return self.fc(x)


def test_parameter_written_in_forward_gets_its_values_back() -> None:
    torch.manual_seed(0)
    model = ClipsItsWeight()
    before = params_of(model)
    ipd.audit(model, mlp_input())
    # values, identity and version: the bytes are put back, so is the version (a graph of the
    # caller's that saved the parameter before the audit still accepts it)
    assert_params_unchanged(model, before)


class FlatParams(nn.Module):
    """Two parameters that are views of one flat storage (flat-parameter
    optimizers, FSDP's use_orig_params); forward clips the first in place."""

    def __init__(self) -> None:
        super().__init__()
        flat = torch.randn(32)
        self.a = nn.Parameter(flat[:16].view(2, 8))
        self.b = nn.Parameter(flat[16:].view(2, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.a.mul_(0.5)
        return x @ self.a.t() + x @ self.b.t()


def test_parameters_sharing_a_storage_get_their_values_back() -> None:
    torch.manual_seed(0)
    model = FlatParams()
    assert model.a.untyped_storage().data_ptr() == model.b.untyped_storage().data_ptr()
    before = params_of(model)
    ipd.audit(model, mlp_input())
    assert_params_unchanged(model, before)


class AssignsWeightData(nn.Module):
    """Weight clipping by rebinding `.data` (a common idiom) instead of writing in place."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fc.weight.data = self.fc.weight.data.clamp(-0.05, 0.05)
        return self.fc(x)


def test_parameter_data_rebound_in_forward_gets_its_values_back() -> None:
    torch.manual_seed(0)
    model = AssignsWeightData()
    before = params_of(model)
    ipd.audit(model, mlp_input())
    assert_params_unchanged(model, before, check_version=False)


class TransposesWeightData(nn.Module):
    """Rebinds `.data` to a view of the same memory (same first byte, same shape): only the
    strides tell the binding changed."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fc.weight.data = self.fc.weight.data.t()
        return self.fc(x)


def test_parameter_data_rebound_to_a_same_memory_view_is_put_back() -> None:
    torch.manual_seed(0)
    model = TransposesWeightData()
    before, stride = model.fc.weight.detach().clone(), model.fc.weight.stride()
    ipd.audit(model, mlp_input())
    assert model.fc.weight.stride() == stride and torch.equal(model.fc.weight, before)


class ReassignsWeight(nn.Module):
    """Replaces its parameter object in forward (`module.weight = nn.Parameter(...)`)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fc.weight = nn.Parameter(self.fc.weight.detach().clamp(-0.05, 0.05))
        return self.fc(x)


def test_parameter_replaced_in_forward_is_put_back() -> None:
    torch.manual_seed(0)
    model = ReassignsWeight()
    before = params_of(model)
    ipd.audit(model, mlp_input())
    assert_params_unchanged(model, before)


class HalfLazy(nn.Module):
    """A BatchNorm with running stats, then a LazyLinear not yet materialized."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(8)
        self.lazy = nn.LazyLinear(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lazy(self.bn(x))


def test_model_with_an_uninitialized_lazy_module_is_refused_and_left_as_found() -> None:
    torch.manual_seed(0)
    model = HalfLazy()
    model.bn.weight.grad = torch.ones(8)
    grads = grads_of([model.bn.weight, model.bn.bias])
    buffers = buffers_of(model.bn)
    # refused with one clear line, and the model is left exactly as found
    with pytest.raises(ipd.UsageError, match="uninitialized lazy parameter"):
        ipd.audit(model, mlp_input())
    assert_grads_unchanged(grads)
    assert_buffers_unchanged(buffers)


# --------------------------------------------------------------------------
# buffers
# --------------------------------------------------------------------------

BUFFER_MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], torch.Tensor]]] = {
    "batchnorm1d": (mlp, mlp_input),
    "batchnorm2d": (convnet, conv_input),
    "batchnorm1d-cumulative": (
        lambda: nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8, momentum=None), nn.ReLU(inplace=True)),
        mlp_input,
    ),
    "buffer-written-in-place": (CountingModule, mlp_input),
    "buffer-reassigned": (EmaModule, mlp_input),
}


@pytest.mark.parametrize("kind", list(BUFFER_MODELS))
def test_buffers_unchanged(kind: str) -> None:
    make_model, make_input = BUFFER_MODELS[kind]
    torch.manual_seed(0)
    model, x = make_model().train(), make_input()
    # the same forward outside audit does change these buffers: the test is meaningful
    probe = copy.deepcopy(model)
    probe(x)
    assert any(not torch.equal(a, b) for a, b in zip(probe.buffers(), model.buffers()))

    before = buffers_of(model)
    assert before
    ipd.audit(model, x)
    assert_buffers_unchanged(before)


def test_batchnorm_running_stats_named_explicitly() -> None:
    model = mlp()
    bn = model[1]
    assert isinstance(bn, nn.BatchNorm1d)
    mean, var, n = bn.running_mean, bn.running_var, bn.num_batches_tracked
    assert mean is not None and var is not None and n is not None
    values = (mean.clone(), var.clone(), n.clone())
    versions = (mean._version, var._version, n._version)
    ipd.audit(model, mlp_input())
    assert bn.running_mean is mean and bn.running_var is var and bn.num_batches_tracked is n
    assert torch.equal(mean, values[0]) and torch.equal(var, values[1]) and torch.equal(n, values[2])
    assert int(n) == 0
    assert (mean._version, var._version, n._version) == versions


# --------------------------------------------------------------------------
# .grad
# --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(MODELS))
def test_none_grad_stays_none(kind: str) -> None:
    make_model, make_input = MODELS[kind]
    model, x = make_model(), make_input()
    report = ipd.audit(model, x)
    assert report.backward
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("kind", list(MODELS))
def test_existing_grad_keeps_identity_and_values(kind: str) -> None:
    make_model, make_input = MODELS[kind]
    model, x = make_model(), make_input()
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    before = grads_of(list(model.parameters()))
    report = ipd.audit(model, x)
    assert report.backward
    assert_grads_unchanged(before)


def test_mixed_existing_and_none_grads() -> None:
    model, x = mlp(), mlp_input()
    set_grads(model, every=2)
    before = grads_of(list(model.parameters()))
    assert any(g is None for _, g, _, _ in before) and any(g is not None for _, g, _, _ in before)
    ipd.audit(model, x)
    assert_grads_unchanged(before)


# --------------------------------------------------------------------------
# train/eval flags
# --------------------------------------------------------------------------


def _mixed() -> nn.Module:
    model = mlp().train()
    model[1].eval()  # BatchNorm in eval (frozen stats) while the root trains
    model[3].eval()  # Dropout off
    return model


class FlipsModes(nn.Module):
    """Forward switches its children's modes (e.g. a 'freeze BN' helper called inside forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.body.eval()
        self.body[3].train()
        return self.body(x)


@pytest.mark.parametrize(
    ("make_model", "make_input"),
    [
        (lambda: mlp().train(), mlp_input),
        (_mixed, mlp_input),
        (lambda: mlp().eval(), mlp_input),
        (lambda: convnet().eval(), conv_input),
        (FlipsModes, mlp_input),
    ],
    ids=["train", "mixed", "eval", "eval-convnet", "forward-flips-modes"],
)
def test_train_eval_flags_unchanged(
    make_model: Callable[[], nn.Module], make_input: Callable[[], torch.Tensor]
) -> None:
    model, x = make_model(), make_input()
    before = flags_of(model)
    report = ipd.audit(model, x)
    assert flags_of(model) == before
    assert report.mode == ("train" if before[0][1] else "eval")


# --------------------------------------------------------------------------
# global RNG
# --------------------------------------------------------------------------


class DrawsFromEveryRng(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = 1.0 + random.random() + float(np.random.rand())
        return self.body(x) * scale + torch.rand(1)


def test_torch_rng_unchanged_with_dropout_in_train_mode() -> None:
    model, x = mlp().train(), mlp_input()
    torch.manual_seed(123)
    state = torch.get_rng_state()
    report = ipd.audit(model, x)
    assert report.backward
    assert torch.equal(torch.get_rng_state(), state)
    # and the next draw is the one the caller would have got without the audit
    drawn = torch.rand(4)
    torch.set_rng_state(state)
    assert torch.equal(torch.rand(4), drawn)


def test_python_and_numpy_rng_unchanged() -> None:
    model, x = DrawsFromEveryRng().train(), mlp_input()
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    rng = RngSnapshot()
    ipd.audit(model, x)
    rng.assert_unchanged()


# --------------------------------------------------------------------------
# the caller's inputs
# --------------------------------------------------------------------------


class ScalesItsInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return self.fc(x)


def _whole() -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.randn(6, 8)
    return t, t


def _slice() -> tuple[torch.Tensor, torch.Tensor]:
    big = torch.randn(10, 8)
    return big, big[2:8]  # a slice of a larger tensor


def _transposed() -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.randn(8, 6)
    return t, t.t()  # a non-contiguous view


@pytest.mark.parametrize("make_input", [_whole, _slice, _transposed], ids=["contiguous", "slice", "transposed"])
def test_input_written_in_place_by_the_model_keeps_its_values(
    make_input: Callable[[], tuple[torch.Tensor, torch.Tensor]]
) -> None:
    base, x = make_input()
    base_before, x_before = base.clone(), x.clone()
    torch.manual_seed(0)
    ipd.audit(ScalesItsInput(), x)
    assert torch.equal(x, x_before)
    assert torch.equal(base, base_before)  # nothing else in the caller's storage touched


def test_input_requiring_grad_keeps_none_grad() -> None:
    model = mlp()
    x = torch.randn(6, 8, requires_grad=True)
    value = x.detach().clone()
    report = ipd.audit(model, x)
    assert report.backward
    assert x.grad is None
    assert torch.equal(x, value)
    assert all(p.grad is None for p in model.parameters())


def test_input_with_existing_grad_keeps_it() -> None:
    model = mlp()
    x = torch.randn(6, 8, requires_grad=True)
    x.grad = torch.ones_like(x)
    before = grads_of([x])
    ipd.audit(model, x)
    assert_grads_unchanged(before)


class ScalesBothInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        y.mul_(2)
        return self.fc(x) + self.fc(y)


def test_inputs_sharing_a_storage_keep_their_values() -> None:
    pair = torch.randn(2, 6, 8)
    x, y = pair.unbind(0)
    before = pair.clone()
    torch.manual_seed(0)
    ipd.audit(ScalesBothInputs(), x, y)
    assert torch.equal(pair, before)


class HeadOnBatch(nn.Module):
    """A sub-module whose features arrive inside a container."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, batch: Any = None, **kwargs: Any) -> torch.Tensor:
        if batch is None:
            features = kwargs["features"]
        elif isinstance(batch, torch.Tensor):
            features = batch
        elif isinstance(batch, dict):
            features = batch["features"]
        elif hasattr(batch, "features"):
            features = batch.features
        else:
            features = batch[0]
        return self.fc(features)


Batch = collections.namedtuple("Batch", "features")

@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda head, f: ipd.audit(head, f), id="positional"),
        pytest.param(lambda head, f: ipd.audit(head, features=f), id="keyword"),
        pytest.param(lambda head, f: ipd.audit(head, [f]), id="list"),
        pytest.param(lambda head, f: ipd.audit(head, {"features": f}), id="dict"),
        pytest.param(lambda head, f: ipd.audit(head, Batch(f)), id="namedtuple"),
        pytest.param(
            lambda head, f: ipd.audit(head, collections.OrderedDict(features=f)), id="ordereddict",
        ),
    ],
)
def test_auditing_a_submodule_leaves_the_upstream_graph_alone_whatever_the_container(
    call: Callable[[nn.Module, torch.Tensor], Any]
) -> None:
    torch.manual_seed(0)
    backbone, head = nn.Linear(8, 8), HeadOnBatch()
    features = backbone(torch.randn(4, 8))
    report = call(head, features)
    assert report.backward
    assert backbone.weight.grad is None and backbone.bias.grad is None
    features.sum().backward()  # the caller's graph is still usable
    assert backbone.bias.grad is not None
    assert torch.equal(backbone.bias.grad, torch.full((8,), 4.0))


def test_non_leaf_input_written_in_place_keeps_its_autograd_history() -> None:
    leaf = torch.randn(6, 8, requires_grad=True)
    x = leaf * 1
    grad_fn = x.grad_fn
    torch.manual_seed(0)
    ipd.audit(ScalesItsInput(), x, backward=False)
    assert torch.equal(x, leaf)
    x.sum().backward()
    assert leaf.grad is not None
    assert torch.equal(leaf.grad, torch.ones_like(leaf))
    assert x.grad_fn is grad_fn


# --------------------------------------------------------------------------
# restored on the error paths too
# --------------------------------------------------------------------------


class RaisesMidForward(nn.Module):
    """Runs BatchNorm (running stats), Dropout (RNG), writes its input, then raises."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.body = mlp()
        self.error = error

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        x.mul_(2)
        random.random()
        np.random.rand()
        if h.sum() != 12345:
            raise self.error
        return h


def _full_snapshot(model: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    params, buffers = params_of(model), buffers_of(model)
    grads, flags = grads_of(list(model.parameters())), flags_of(model)
    rng, value = RngSnapshot(), x.clone()

    def check() -> None:
        assert_params_unchanged(model, params)
        assert_buffers_unchanged(buffers)
        assert_grads_unchanged(grads)
        assert flags_of(model) == flags
        rng.assert_unchanged()
        assert torch.equal(x, value)

    return check


def test_restored_when_the_model_raises_in_forward() -> None:
    original = ValueError("shape mismatch in the head")
    model, x = RaisesMidForward(original), mlp_input()
    set_grads(model)
    check = _full_snapshot(model, x)
    with pytest.raises(ipd.ModelError) as info:
        ipd.audit(model, x)
    assert info.value.__cause__ is original
    assert "ValueError" in str(info.value)
    check()


def test_restored_when_forward_is_interrupted() -> None:
    model, x = RaisesMidForward(KeyboardInterrupt()), mlp_input()
    set_grads(model)
    check = _full_snapshot(model, x)
    with pytest.raises(KeyboardInterrupt):
        ipd.audit(model, x)
    check()


def test_restored_when_backward_hits_an_inplace_error() -> None:
    torch.manual_seed(0)
    model, x = SigmoidReluHead().train(), mlp_input()
    # A plain backward accumulates into `out` before it reaches the overwritten tensor and raises.
    probe = copy.deepcopy(model)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        probe(x).sum().backward()
    assert probe.out.weight.grad is not None and probe.out.bias.grad is not None
    # an existing grad where backward gets to (must not be accumulated into), None elsewhere
    model.out.weight.grad = torch.randn_like(model.out.weight)
    model.fc.weight.grad = torch.randn_like(model.fc.weight)
    check = _full_snapshot(model, x)
    report = ipd.audit(model, x)
    assert "IPD101" in report.codes
    [finding] = [f for f in report.findings if f.code == "IPD101"]
    assert finding.severity is Severity.ERROR and finding.confirmed is True
    assert report.backward
    check()


# --------------------------------------------------------------------------
# watch(): a training step is bit-identical inside and outside
# --------------------------------------------------------------------------


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int = 3) -> None:
    torch.manual_seed(1)
    for _ in range(steps):
        x, target = torch.randn(6, 8), torch.randint(0, 4, (6,))
        loss = nn.functional.cross_entropy(model(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        lambda ps: torch.optim.Adam(ps, lr=1e-2),
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=False),
    ],
    ids=["sgd-momentum", "adam", "adamw-for-loop"],
)
def test_watch_training_step_is_bit_identical(make_opt: Callable[[Any], torch.optim.Optimizer]) -> None:
    plain = mlp()
    plain_opt = make_opt(plain.parameters())
    _train(plain, plain_opt)

    watched = mlp()
    watched_opt = make_opt(watched.parameters())
    with ipd.watch(watched) as session:
        _train(watched, watched_opt)
    assert not session.failed()

    a, b = plain.state_dict(), watched.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
    assert int(b["1.num_batches_tracked"]) == 3
    sa, sb = plain_opt.state_dict()["state"], watched_opt.state_dict()["state"]
    assert sa.keys() == sb.keys() and sa
    for k in sa:
        assert sa[k].keys() == sb[k].keys()
        for name in sa[k]:
            assert torch.equal(torch.as_tensor(sa[k][name]), torch.as_tensor(sb[k][name])), (k, name)
    for p, q in zip(plain.parameters(), watched.parameters()):
        assert p.grad is not None and q.grad is not None
        assert torch.equal(p.grad, q.grad)


# --------------------------------------------------------------------------
# no tensor kept alive
# --------------------------------------------------------------------------


class LeafWriter(nn.Module):
    """Writes its leaf input in place with grad on: PyTorch raises at the op (IPD102, reported)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        x.mul_(2)
        return h


LEAK_CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[], torch.Tensor], str | None]] = {
    "mlp": (mlp, mlp_input, None),
    "convnet": (convnet, conv_input, None),
    "backward-inplace-error": (SigmoidReluHead, mlp_input, "IPD101"),
    "forward-inplace-error": (LeafWriter, lambda: torch.randn(6, 8, requires_grad=True), "IPD102"),
}


@pytest.mark.parametrize("case", list(LEAK_CASES))
def test_audit_keeps_no_tensor_alive(case: str) -> None:
    make_model, make_input, code = LEAK_CASES[case]
    model, x = make_model().train(), make_input()
    report = ipd.audit(model, x)  # warm-up: lazily built caches, first-call allocations
    del report
    before = live_tensors()
    report = ipd.audit(model, x)
    assert report.codes == ([code] if code else [])
    assert live_tensors() == before  # the report itself holds no tensor either
    del report
    assert live_tensors() == before
    for _ in range(3):  # and nothing piles up over repeated audits
        ipd.audit(model, x)
    assert live_tensors() == before


class RaisesFresh(nn.Module):
    """Runs a few layers, then raises an ordinary error (a bug in the user's model)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        raise ValueError(f"bad shape {tuple(h.shape)}")


def _audit_model_error() -> None:
    with pytest.raises(ipd.ModelError):
        ipd.audit(RaisesFresh(), mlp_input())


def _watch_caught_op_error() -> None:
    model = nn.Linear(8, 8)
    with ipd.watch():
        h = model(mlp_input())
        try:  # a fast path that fails, then a fallback: ordinary user code
            torch.mm(h, torch.ones(3, 3))
        except RuntimeError:
            pass
        del h


@pytest.mark.parametrize(
    "run", [_audit_model_error, _watch_caught_op_error], ids=["audit-model-error", "watch-caught-op-error"]
)
def test_run_stopped_by_an_exception_keeps_no_tensor_alive(run: Callable[[], None]) -> None:
    run()  # warm-up
    before = live_tensors()
    for _ in range(3):
        run()
    assert live_tensors() == before


def test_graphs_dropped_without_backward_inside_watch_do_not_accumulate() -> None:
    model, x = mlp(), mlp_input()
    counts: dict[int, int] = {}
    with ipd.watch(model) as session:
        y = torch.sigmoid(model(x))
        one_graph = session.tracer.live_saved_tensors()
        assert one_graph > 0
        del y
        for i in range(1, 201):
            y = torch.sigmoid(model(x))
            del y
            if i in (20, 200):
                counts[i] = live_tensors()
                # at most the last dropped graph may still be referenced (it is named at the next op)
                assert session.tracer.live_saved_tensors() <= one_graph
    assert counts[200] == counts[20], counts
    assert session.tracer.live_saved_tensors() == 0
    assert session.findings == []
