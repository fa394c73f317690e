"""optimize, checked against ground truth on models built to fool it.

The worst thing optimize can do is call a site safe that is not: the user applies the config and
their outputs or gradients change without a word. So every plan here is checked by running the
model twice outside the tool, with the plan's flags applied and with every `inplace` off, for two
optimizer steps from the same seed, and comparing outputs, parameter and input gradients, buffers,
parameters and the inputs themselves bit for bit. The models: one module instance called at a safe
and an unsafe place, forwards that depend on the mode, a flag or the input's shape, hooks that read
a module's input after it ran, writes into views of a parameter or of the input, a tensor returned
beside its in-place activation, a module reused in a loop, a Sequential sharing a module, functional
calls whose flag is a module attribute, dropout, BatchNorm in eval, a buffer updated in forward,
checkpointed regions, and a forward that raises. test_optimize.py covers the plain decisions, the
zoo and the CLI; test_restore_adversarial.py what optimize leaves behind on hard-to-restore models.
"""

from __future__ import annotations

import copy
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.engines.optimize import inplace_modules
from inplace_doctor.engines.verify import ATOL, RTOL


def sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


# --------------------------------------------------------------------------
# the models
# --------------------------------------------------------------------------


class SharedTwoPlaces(nn.Module):
    """One ReLU instance: after a Linear (safe), then on a tensor the add reads after it (not)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc2(self.act(self.fc1(x)))
        return h + self.act(h)


class SharedAfterSigmoid(nn.Module):
    """One ReLU instance: after a Linear (safe), then on sigmoid's output, which sigmoid saved."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(torch.sigmoid(self.fc2(self.act(self.fc1(x)))))


class ResidualInEval(nn.Module):
    """Train: a plain activation; eval: the activation's input is read again by a residual add."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return self.act(h) if self.training else h + self.act(h)


class ResidualByFlag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor, residual: bool = False) -> torch.Tensor:
        h = self.fc(x)
        return h + self.act(h) if residual else self.act(h)


class ResidualForLargeBatches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return h + self.act(h) if x.shape[0] > 4 else self.act(h)


def _add_input(module: nn.Module, inp: tuple[torch.Tensor, ...], out: torch.Tensor) -> torch.Tensor:
    return out + inp[0]  # the activation's input, read after the activation ran


def _stash_input(module: nn.Module, inp: tuple[torch.Tensor, ...]) -> None:
    module.__dict__["stashed"] = inp[0]


class HookReadsInput(nn.Module):
    """A forward hook that adds the activation's input to its output (a residual written as a hook)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)
        self.act.register_forward_hook(_add_input)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class PreHookStashesInput(nn.Module):
    """A forward pre-hook keeps the activation's input; forward reads it after the activation."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)
        self.act = nn.Hardtanh(-0.5, 0.5, inplace=True)
        self.act.register_forward_pre_hook(_stash_input)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.fc1(x))
        return self.fc2(y) * self.act.__dict__.pop("stashed").sum()


class ActOnParameterView(nn.Module):
    """The activation runs on a view of a parameter: in place, it writes the parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(4, 8))
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.act(self.table[0:2]).t()


class ActOnInputView(nn.Module):
    """The activation runs on a slice of the caller's input (which needs no gradient)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.act(x[:, :4]))


class ReadsAViewTakenBefore(nn.Module):
    """Keeps a slice of the activation's input, taken before the activation, and reads it after."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        kept = h[:, :4]
        return self.act(h)[:, 4:] + kept


class KeepsForTheNextCall(nn.Module):
    """Keeps the pre-activation (detached, so sharing its memory) as a plain attribute that the next
    call reads: the write shows one step later, outside any buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)
        self.previous = torch.zeros(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        out = self.act(h) + self.previous
        self.previous = h.detach()
        return out


class ReturnsItsInputToo(nn.Module):
    """Returns the pre-activation beside the activation: in place, both outputs are the activation."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.fc(x)
        return h, self.act(h)


class LoopKeepsPreActivations(nn.Module):
    """An RNN-like loop that keeps each step's pre-activation and stacks them at the end."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(16, 8)
        self.act = nn.Tanh()
        self.gate = nn.ReLU(inplace=True)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        h = xs.new_zeros(xs.shape[1], 8)
        kept = []
        for x in xs:
            z = self.cell(torch.cat([x, h], 1))
            kept.append(z)
            h = self.act(self.gate(z))
        return torch.stack(kept).sum(0) + h


class LoopSafe(nn.Module):
    """The same loop, keeping each step's output (written before it is kept): safe."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(16, 8)
        self.gate = nn.ReLU(inplace=True)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        h = xs.new_zeros(xs.shape[1], 8)
        kept = []
        for x in xs:
            h = self.gate(self.cell(torch.cat([x, h], 1)))
            kept.append(h)
        return torch.stack(kept).sum(0)


def shared_sequential() -> nn.Module:
    """A Sequential holding one ReLU twice: after a Linear, and after a Sigmoid (which saved its output)."""
    act = nn.ReLU(inplace=True)
    return nn.Sequential(nn.Linear(8, 8), act, nn.Linear(8, 8), nn.Sigmoid(), act, nn.Linear(8, 1))


def shared_sequential_safe() -> nn.Module:
    act = nn.ReLU(inplace=True)
    return nn.Sequential(nn.Linear(8, 8), act, nn.Linear(8, 8), act, nn.Linear(8, 1))


class GateBlock(nn.Module):
    """A block whose own `inplace` attribute controls a functional call, read by a residual."""

    def __init__(self, residual: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.inplace = True
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        y = F.relu(h, inplace=self.inplace)
        return y + h if self.residual else y


class TwoGates(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.safe, self.unsafe = GateBlock(residual=False), GateBlock(residual=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.unsafe(self.safe(x))


class DropoutResidual(nn.Module):
    """In-place dropout read again by a residual, and one after a Linear (safe)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)
        self.drop_safe = nn.Dropout(0.5, inplace=True)
        self.drop_residual = nn.Dropout(0.5, inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc2(self.drop_safe(self.fc1(x)))
        return h + self.drop_residual(h)


def conv_bn_relu() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=True),
        nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=True),
        nn.Flatten(), nn.Linear(4 * 6 * 6, 2),
    )


class EmaOfPreActivation(nn.Module):
    """A buffer updated in forward from the activation's input, after the activation ran."""

    ema: torch.Tensor
    calls: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)
        self.register_buffer("ema", torch.zeros(8))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        y = self.act(h)
        with torch.no_grad():
            self.ema.mul_(0.9).add_(h.mean(0), alpha=0.1)
            self.calls += 1
        return y


class CheckpointedActivation(nn.Module):
    """A non-idempotent in-place activation checkpointed on its own: the recompute applies it again
    to the tensor the forward already wrote."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)
        self.act = nn.ELU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(cp.checkpoint(self.act, self.fc1(x), use_reentrant=False))


class CheckpointedBlock(nn.Module):
    """A checkpointed Linear-ReLU-Linear block: the ReLU writes a tensor made inside the region."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 8))
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(cp.checkpoint(self.block, x, use_reentrant=False))


class RaisesBeforeTheResidual(nn.Module):
    """Shipped, forward raises at `first` (in place on a leaf that requires grad), before `second` runs."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.ReLU(inplace=True)
        self.fc = nn.Linear(8, 8)
        self.second = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(self.first(x))
        return h + self.second(h)


class ResidualFromTheSecondCall(nn.Module):
    """A forward that changes after its first call (a warm-up counted in a buffer): from then on a
    residual reads the input of `act`, and `late` runs (it never ran in the first call)."""

    calls: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)
        self.late = nn.ReLU(inplace=True)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        warm = bool(self.calls > 0)
        self.calls += 1
        h = self.fc(x)
        if not warm:
            return self.act(h)
        h = h + self.act(h)
        return h + self.late(h)


class FunctionalByOtherName(nn.Module):
    """Functional calls whose flag is an attribute not called `inplace`: sites optimize cannot set,
    reported with the line to change."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)
        self.first_in_place = self.second_in_place = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc2(F.relu(self.fc1(x), inplace=self.first_in_place))  # safe
        return h + F.relu(h, inplace=self.second_in_place)  # read by the add


# --------------------------------------------------------------------------
# ground truth: the plan applied vs. everything out of place, outside the tool
# --------------------------------------------------------------------------

Inputs = Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]


def randn(*shape: int, grad: bool = False) -> Inputs:
    def make() -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (torch.randn(*shape, requires_grad=grad),), {}
    return make


@dataclass
class Case:
    factory: Callable[[], nn.Module]
    inputs: Inputs
    train: bool = True
    unsafe: set[str] = field(default_factory=set)  # sites the plan must switch off


CASES: dict[str, Case] = {
    "one ReLU, safe then read by a residual": Case(SharedTwoPlaces, randn(4, 8), unsafe={"act"}),
    "one ReLU, safe then after a sigmoid": Case(SharedAfterSigmoid, randn(4, 8), unsafe={"act"}),
    "residual only in eval, planned in train": Case(ResidualInEval, randn(4, 8)),
    "residual only in eval, planned in eval": Case(ResidualInEval, randn(4, 8), train=False, unsafe={"act"}),
    "residual by a keyword flag": Case(
        ResidualByFlag, lambda: ((torch.randn(4, 8),), {"residual": True}), unsafe={"act"}),
    "residual for large batches, a small one": Case(ResidualForLargeBatches, randn(4, 8)),
    "residual for large batches, a large one": Case(ResidualForLargeBatches, randn(8, 8), unsafe={"act"}),
    "forward hook reads the input": Case(HookReadsInput, randn(4, 8), unsafe={"act"}),
    "pre-hook stashes the input": Case(PreHookStashesInput, randn(4, 8), unsafe={"act"}),
    "activation on a parameter's view": Case(ActOnParameterView, randn(4, 8), unsafe={"act"}),
    "activation on the input's view": Case(ActOnInputView, randn(4, 8), unsafe={"act"}),
    "activation on the input's view, input requires grad": Case(
        ActOnInputView, randn(4, 8, grad=True), unsafe={"act"}),
    "a view of the pre-activation read after": Case(ReadsAViewTakenBefore, randn(4, 8), unsafe={"act"}),
    "pre-activation kept for the next call": Case(KeepsForTheNextCall, randn(4, 8), unsafe={"act"}),
    "pre-activation returned too": Case(ReturnsItsInputToo, randn(4, 8), unsafe={"act"}),
    "loop keeps pre-activations": Case(LoopKeepsPreActivations, randn(3, 4, 8), unsafe={"gate"}),
    "loop keeps activations": Case(LoopSafe, randn(3, 4, 8)),
    "Sequential shares a ReLU after a sigmoid": Case(shared_sequential, randn(4, 8), unsafe={"1"}),
    "Sequential shares a ReLU, both safe": Case(shared_sequential_safe, randn(4, 8)),
    "functional call flagged by a module attribute": Case(TwoGates, randn(4, 8), unsafe={"unsafe"}),
    "in-place dropout, train": Case(DropoutResidual, randn(4, 8), unsafe={"drop_residual"}),
    "in-place dropout, eval": Case(DropoutResidual, randn(4, 8), train=False),
    "in-place RReLU, train": Case(lambda: nn.Sequential(nn.Linear(8, 8), nn.RReLU(inplace=True), nn.Linear(8, 1)), randn(4, 8)),
    "conv-BN-ReLU, train": Case(conv_bn_relu, randn(2, 3, 6, 6)),
    "conv-BN-ReLU, eval": Case(conv_bn_relu, randn(2, 3, 6, 6), train=False),
    "buffer from the pre-activation": Case(EmaOfPreActivation, randn(4, 8), unsafe={"act"}),
    "checkpointed in-place ELU": Case(CheckpointedActivation, randn(4, 8), unsafe={"act"}),
    "checkpointed block": Case(CheckpointedBlock, randn(4, 8)),
    "residual from the second call on": Case(ResidualFromTheSecondCall, randn(4, 8), unsafe={"act", "late"}),
    "forward raises before the residual": Case(
        RaisesBeforeTheResidual, randn(4, 8, grad=True), unsafe={"first", "second"}),
}


def flags_of(model: nn.Module) -> dict[str, bool]:
    return {name: m.inplace for name, m in inplace_modules(model).items()}


@dataclass
class Observed:
    """What a program did over its steps: every tensor it produced or left, by name."""

    tensors: dict[str, torch.Tensor]
    error: str | None = None


def run_program(model: nn.Module, case: Case, steps: int = 2) -> Observed:
    """`steps` training steps of `model` from seed 0, every tensor the user could look at kept."""
    torch.manual_seed(0)
    opt = sgd(model.parameters())
    seen: dict[str, torch.Tensor] = {}
    try:
        for step in range(steps):
            args, kwargs = case.inputs()
            out = model(*args, **kwargs)
            outs = out if isinstance(out, tuple) else (out,)
            sum(o.sum() for o in outs).backward()
            for i, o in enumerate(outs):
                seen[f"step {step} output {i}"] = o.detach().clone()
            for i, a in enumerate(args):
                seen[f"step {step} input {i} after"] = a.detach().clone()
                if a.grad is not None:
                    seen[f"step {step} input {i} grad"] = a.grad.clone()
            for name, p in model.named_parameters():
                seen[f"step {step} grad of {name}"] = p.grad.clone()
            opt.step()
            opt.zero_grad()
            for name, t in model.state_dict().items():
                seen[f"step {step} {name} after"] = t.clone()
        seen["RNG after"] = torch.get_rng_state()
    except RuntimeError as e:
        return Observed(seen, f"{type(e).__name__}: {str(e).splitlines()[0]}")
    return Observed(seen)


def differences(a: Observed, b: Observed) -> list[str]:
    if a.error or b.error:
        return [f"planned raises {a.error}" if a.error else "", f"plain raises {b.error}" if b.error else ""]
    return [k for k in b.tensors if k not in a.tensors or not torch.equal(a.tensors[k], b.tensors[k])]


def planned_and_plain(case: Case, config: dict[str, bool]) -> tuple[Observed, Observed]:
    torch.manual_seed(0)
    shipped = case.factory().train(case.train)
    planned, plain = copy.deepcopy(shipped), copy.deepcopy(shipped)
    ipd.apply_config(planned, config)
    ipd.apply_config(plain, {name: False for name in flags_of(plain)})
    return run_program(planned, case), run_program(plain, case)


@dataclass
class Optimized:
    plan: ipd.Plan
    model: nn.Module
    before: dict[str, Any]  # the model, its input and the RNG as they were before optimize


def _state(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    return {
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "flags": flags_of(model),
        "training": {n: m.training for n, m in model.named_modules()},
        "inputs": [(a.clone(), a._version, a.requires_grad, a.grad) for a in args if isinstance(a, torch.Tensor)],
        "kwargs": dict(kwargs),
        "rng": torch.get_rng_state(),
    }


def shipped_off(factory: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    """`factory`'s model with every `inplace` off: what optimize(enable_safe=True) may turn on."""
    def make() -> nn.Module:
        model = factory()
        for m in inplace_modules(model).values():
            m.inplace = False
        return model
    return make


# Each case again shipped all out of place, planned with enable_safe=True: here optimize itself
# switches the sites it calls safe on, so a wrong "safe" shows as a difference.
CASES.update({
    f"{name}, shipped off, enable_safe": Case(shipped_off(case.factory), case.inputs, case.train, case.unsafe)
    for name, case in list(CASES.items())
})


@pytest.fixture(scope="module")
def optimized() -> Callable[[str], Optimized]:
    cache: dict[str, Optimized] = {}

    def get(name: str) -> Optimized:
        if name not in cache:
            case = CASES[name]
            torch.manual_seed(0)
            model = case.factory().train(case.train)
            args, kwargs = case.inputs()
            before = _state(model, args, kwargs)
            plan = ipd.optimize(model, *args, optimizer=sgd, suggest_checkpoint=False,
                                enable_safe=name.endswith("enable_safe"), **kwargs)
            assert _equal_states(before, _state(model, args, kwargs)), "optimize changed the model, its input or the RNG"
            cache[name] = Optimized(plan, model, before)
        return cache[name]
    return get


def _equal_states(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (
        a["flags"] == b["flags"] and a["training"] == b["training"] and a["kwargs"] == b["kwargs"]
        and a["state"].keys() == b["state"].keys() and all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"])
        and torch.equal(a["rng"], b["rng"])
        and len(a["inputs"]) == len(b["inputs"])
        and all(torch.equal(x[0], y[0]) and x[1:] == y[1:] for x, y in zip(a["inputs"], b["inputs"]))
    )


# --------------------------------------------------------------------------
# the decisions, against ground truth
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_the_plan_changes_nothing_the_user_can_observe(name: str, optimized: Callable[[str], Optimized]) -> None:
    case, plan = CASES[name], optimized(name).plan
    planned, plain = planned_and_plain(case, plan.config())
    assert plain.error is None, plain.error  # the ground truth itself runs
    assert not differences(planned, plain), (differences(planned, plain), str(plan))
    assert bool(plan.verified), str(plan.verified)
    assert plan.mode == ("train" if case.train else "eval")


@pytest.mark.parametrize("name", list(CASES))
def test_the_unsafe_sites_are_switched_off_and_only_they(name: str, optimized: Callable[[str], Optimized]) -> None:
    # Conservative is not wrong, but a safe site called unsafe is a saving lost with a false reason.
    case, plan = CASES[name], optimized(name).plan
    modules = {d.site: d for d in plan.decisions if d.kind == "module"}
    assert {site for site, d in modules.items() if d.safe is False} == case.unsafe, str(plan)
    assert all(not modules[site].inplace and modules[site].evidence for site in case.unsafe)


@pytest.mark.parametrize("name", list(CASES))
def test_the_written_config_sets_a_fresh_instance_as_planned(name: str, optimized: Callable[[str], Optimized], tmp_path) -> None:
    case, plan = CASES[name], optimized(name).plan
    path = tmp_path / "inplace.toml"
    plan.write(path)
    assert os.listdir(tmp_path) == ["inplace.toml"]  # the file named, and no temporary left beside it
    fresh = case.factory()
    ipd.apply_config(fresh, path)
    assert flags_of(fresh) == {**flags_of(case.factory()), **plan.config()}


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case.unsafe and "shipped off" not in name])
def test_the_ground_truth_sees_what_the_shipped_flags_change(name: str) -> None:
    # The comparison above can fail: as shipped, each of these models computes something else
    # than its out-of-place program, or raises.
    case = CASES[name]
    shipped, plain = planned_and_plain(case, {})
    assert shipped.error is not None or differences(shipped, plain)


def test_a_module_first_reached_once_an_earlier_site_is_off_is_decided_on_evidence(
    optimized: Callable[[str], Optimized],
) -> None:
    plan = optimized("forward raises before the residual").plan
    second = next(d for d in plan.decisions if d.site == "second")
    assert second.safe is False and "IPD105" in second.reason and plan.never_executed == []
    assert "shipped configuration raises" in second.reason and "lets the step run" not in second.reason


# --------------------------------------------------------------------------
# functional calls: decided, reported, not set
# --------------------------------------------------------------------------


def test_a_call_whose_flag_is_a_module_s_inplace_is_not_called_safe_beside_its_finding(
    optimized: Callable[[str], Optimized],
) -> None:
    # `F.relu(h, inplace=self.inplace)`: its finding is charged to the module's flag, which is set
    # off; the line itself is listed too, and must not read "no finding names this call".
    plan = optimized("functional call flagged by a module attribute").plan
    unsafe = next(d for d in plan.decisions if d.site == "unsafe")
    (call,) = [d for d in plan.decisions if d.kind == "call"]
    assert call.site.rsplit(":", 1)[1] in unsafe.reason  # the same line
    assert "no finding names" not in call.reason and "of unsafe, decided above" in call.reason


def test_functional_calls_are_decided_against_ground_truth() -> None:
    torch.manual_seed(0)
    model, x = FunctionalByOtherName(), torch.randn(4, 8)
    plan = ipd.optimize(model, x, optimizer=sgd, suggest_checkpoint=False)
    first, second = sorted((d for d in plan.decisions if d.kind == "call"), key=lambda d: int(d.site.rsplit(":", 1)[1]))
    assert first.safe is True and first.inplace
    assert second.safe is False and not second.inplace and "IPD105" in second.reason
    assert f"{second.site}: change to inplace=False" in plan.toml() and plan.config() == {}
    # The lines changed as the config says give the out-of-place program; as shipped they do not.
    case = Case(FunctionalByOtherName, randn(4, 8))

    def program(first: bool, second: bool) -> Observed:
        torch.manual_seed(0)
        model = FunctionalByOtherName()
        model.first_in_place, model.second_in_place = first, second
        return run_program(model, case)

    plain = program(False, False)
    assert differences(program(True, True), plain)
    assert not differences(program(True, False), plain)


# --------------------------------------------------------------------------
# a site optimize would turn on, whose forward hook keeps its input
# --------------------------------------------------------------------------


class WantsInplace(nn.Module):
    """An out-of-place activation whose in-place form lowers the peak (test_optimize.py's)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 2048)
        self.act = nn.Hardtanh(inplace=False)
        self.fc2 = nn.Linear(2048, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            h = self.fc(x)
        return self.fc2(self.act(h))


def test_a_site_whose_forward_hook_keeps_its_input_is_not_turned_on() -> None:
    # Feature extraction: the hook keeps the activation's input; in place it would keep the
    # activation's output, read after forward where neither audit nor verify looks.
    torch.manual_seed(0)
    model, x = WantsInplace(), torch.randn(128, 16) * 4
    unhooked = ipd.optimize(model, x, suggest_checkpoint=False)
    assert unhooked.config() == {"act": True}  # it would be turned on: it lowers the peak
    kept: list[torch.Tensor] = []
    model.act.register_forward_hook(lambda module, inp, out: kept.append(inp[0]))
    plan = ipd.optimize(model, x, suggest_checkpoint=False, enable_safe=True)
    act = next(d for d in plan.decisions if d.site == "act")
    assert plan.config() == {"act": False} and "forward hook" in act.reason
    kept.clear()
    configured = copy.deepcopy(model)
    plan.apply(configured)
    configured(x)
    assert torch.equal(kept[-1], model.fc(x).detach())  # the hook keeps what it kept as shipped


# --------------------------------------------------------------------------
# what it measures is measured; what it writes is only what it was asked to
# --------------------------------------------------------------------------


def test_the_saving_of_a_site_kept_on_is_what_memory_measures_with_it_off(tmp_path, monkeypatch) -> None:
    torch.manual_seed(0)
    model, x = WantsInplace(), torch.randn(128, 16)
    model.act.inplace = True
    monkeypatch.chdir(tmp_path)
    plan = ipd.optimize(model, x, optimizer=sgd, suggest_checkpoint=False)
    assert os.listdir(tmp_path) == []  # optimize writes no file of its own
    act = next(d for d in plan.decisions if d.site == "act")
    off = copy.deepcopy(model)
    off.act.inplace = False
    on_peak, off_peak = ipd.memory(model, x, optimizer=sgd).peak, ipd.memory(off, x, optimizer=sgd).peak
    assert plan.peak_planned == plan.peak_shipped == on_peak
    assert act.inplace and act.saves_bytes == off_peak - on_peak > 0, act.reason
    assert plan.time_planned > 0 and plan.time_shipped == plan.time_planned  # no flag changed: timed once
    assert tomllib.loads(plan.toml())["inplace-doctor"]["peak-planned-bytes"] == on_peak


def test_a_view_read_after_the_write_is_unsafe_whatever_the_traced_batch_holds() -> None:
    # On a batch whose pre-activations are all positive the ReLU changes nothing, so verify finds
    # no difference; the next batch of the same shape has negative ones.
    torch.manual_seed(0)
    model = ReadsAViewTakenBefore()
    with torch.no_grad():
        model.fc.bias += 10
    plan = ipd.optimize(model, torch.randn(4, 8), suggest_checkpoint=False)
    assert plan.config() == {"act": False}


# --------------------------------------------------------------------------
# every activation torch.nn offers in place, switched on by optimize
# --------------------------------------------------------------------------

ACTIVATIONS = ["ReLU", "ReLU6", "LeakyReLU", "ELU", "CELU", "SELU", "SiLU", "Hardswish", "Hardsigmoid", "Hardtanh",
               "Mish", "RReLU", "Threshold", "Dropout", "AlphaDropout", "FeatureAlphaDropout"]
# In place, their backward computes from the result instead of the input: equal within verify's
# tolerance, not bit for bit (measured: 1.5e-8 on a Linear's weight gradient).
FROM_THE_RESULT = {"ELU", "CELU", "SELU"}


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_each_in_place_activation_optimize_switches_on_changes_nothing(name: str) -> None:
    def factory() -> nn.Module:
        act = nn.Threshold(0.1, 0.0) if name == "Threshold" else getattr(nn, name)()
        act.inplace = False
        return nn.Sequential(nn.Linear(8, 8), act, nn.Linear(8, 1))

    case = Case(factory, randn(4, 8))
    torch.manual_seed(0)
    plan = ipd.optimize(factory(), torch.randn(4, 8), optimizer=sgd, suggest_checkpoint=False, enable_safe=True)
    assert plan.config() == {"1": True}, str(plan)
    planned, plain = planned_and_plain(case, plan.config())
    if name not in FROM_THE_RESULT:
        assert not differences(planned, plain)
    else:
        assert planned.error is None and all(
            torch.allclose(planned.tensors[k], plain.tensors[k], atol=ATOL, rtol=RTOL) for k in plain.tensors)
