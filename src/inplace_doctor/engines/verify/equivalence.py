"""`verify`: does an in-place configuration compute exactly what the out-of-place program does?

Runs the model as configured and as an out-of-place baseline (every module
`inplace` flag and every functional `inplace=True` argument forced off for the
run, without editing code; explicit `relu_()` and `+=` are the program's
meaning and stay), each on a deep copy, with cloned inputs and the same RNG
stream, and compares everything a training step produces. The two runs advance
in turns and are compared stage by stage, so verifying holds two copies of the
model and their optimizer state, never a recording of a run. When they differ,
the responsible in-place sites are found by group testing: a binary search for
the smallest prefix of sites that, switched off, gives the baseline's results.
"""

from __future__ import annotations

import copy
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch
from torch.overrides import TorchFunctionMode

from ...errors import UsageError
from ...findings import Finding
from ..preserve import RngState, labelled_tensors, map_tensors, tensors_in
from ...trace.stacks import TORCH_DIR, capture_frames

_TORCH_MODULES_DIR = os.path.join(torch.nn.modules.__path__[0], "")
ATOL, RTOL = 1e-6, 1e-5  # verify's default tolerances


@dataclass(frozen=True)
class Difference:
    """The first tensor that differs between the configured run and the baseline."""

    what: str  # "output[0]", "loss", "grad of fc.weight", "buffer bn.running_mean", "parameter fc.weight after step 2"
    max_abs: float
    max_rel: float

    def __str__(self) -> str:
        return f"{self.what}: max abs difference {self.max_abs:.6g}, max relative {self.max_rel:.6g}"


@dataclass(frozen=True)
class InplaceSite:
    """A place whose in-place behaviour verify can switch off: a module flag or a functional call."""

    kind: str  # "module" or "call"
    where: str  # module path ("layer1.0.relu") or "file:line" of an inplace=True call

    def __str__(self) -> str:
        return f"module {self.where} (inplace=True)" if self.kind == "module" else f"inplace=True call at {self.where}"


@dataclass
class VerifyResult:
    """`bool(result)` is True when the configured model is equivalent to its out-of-place form."""

    equivalent: bool
    differences: list[Difference] = field(default_factory=list)
    culprits: list[InplaceSite] = field(default_factory=list)
    sites: list[InplaceSite] = field(default_factory=list)
    error: str | None = None  # what the configured run raised, if it did
    findings: list[Finding] = field(default_factory=list)
    runs: int = 0

    def __bool__(self) -> bool:
        return self.equivalent

    @property
    def first_difference(self) -> Difference | None:
        return self.differences[0] if self.differences else None

    def __str__(self) -> str:
        if self.error is not None:
            lines = [f"not equivalent: the in-place configuration raised: {self.error}"]
            lines += [f"  {f.code} {f.message.splitlines()[0]}" for f in self.findings]
            return "\n".join(lines)
        if self.equivalent:
            return (
                f"equivalent: outputs, loss, gradients, buffers and inputs match the out-of-place program "
                f"({len(self.sites)} in-place sites, {self.runs} runs)"
            )
        lines = [f"not equivalent: {self.differences[0]}"]
        lines += [f"  also {d}" for d in self.differences[1:5]]
        if self.culprits:
            lines.append("responsible: " + "; ".join(str(c) for c in self.culprits))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """Jupyter: `str(result)` in a <pre>, green when equivalent, red when not (escaped, no script)."""
        import html

        color = "#2e7d32" if self.equivalent else "#b00020"
        return f'<pre class="inplace-doctor-verify" style="white-space:pre-wrap;color:{color}">{html.escape(str(self))}</pre>'


class _Functional(TorchFunctionMode):
    """Records inplace=True calls made outside torch.nn's modules; forces the chosen ones off."""

    def __init__(self, off: set[str] | None) -> None:
        super().__init__()
        self.off = off  # None: everything off
        self.seen: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if kwargs.get("inplace") is True:
            if not _called_by_a_torch_module(sys._getframe(1)):  # module flags are switched on the module
                frames, _ = capture_frames()
                where = f"{frames[-1][0]}:{frames[-1][1]}" if frames else "<unknown>"
                if where not in self.seen:
                    self.seen.append(where)
                if self.off is None or where in self.off:
                    kwargs = {**kwargs, "inplace": False}
        return func(*args, **kwargs)


def _called_by_a_torch_module(frame: Any) -> bool:
    """Whether the first frame outside torch's functional machinery is a torch.nn module's code."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_TORCH_MODULES_DIR):
            return True
        if not filename.startswith(TORCH_DIR):
            return False
        frame = frame.f_back
    return False


def _module_sites(model: torch.nn.Module, flags: Mapping[str, bool] | None = None) -> list[InplaceSite]:
    """The module flags that are on (with `flags` applied over the model's own)."""
    flags = flags or {}
    return [
        InplaceSite("module", name)
        for name, m in model.named_modules()
        if flags.get(name, m.__dict__.get("inplace")) is True
    ]


def _clone_inputs(value: Any) -> Any:
    def clone(t: torch.Tensor) -> torch.Tensor:
        c = t.detach().clone()
        return c.requires_grad_(t.requires_grad) if t.is_leaf or t.requires_grad else c

    return map_tensors(value, clone)


def _make_optimizer(optimizer: Any, params: Iterable[torch.nn.Parameter]) -> Any:
    if optimizer is None:
        return None
    if isinstance(optimizer, torch.optim.Optimizer):
        return type(optimizer)(params, **optimizer.defaults)
    if callable(optimizer):
        return optimizer(params)
    raise UsageError(f"optimizer must be a torch.optim.Optimizer or a callable taking parameters, got {type(optimizer).__name__}")


def _copy_with_flags(model: torch.nn.Module, flags: Mapping[str, bool] | None) -> torch.nn.Module:
    """A deep copy of `model` with `flags` (module path -> inplace) set."""
    model = copy.deepcopy(model)
    if flags:
        for name, m in model.named_modules():
            if name in flags:
                m.inplace = flags[name]
    return model


Stage = list[tuple[str, torch.Tensor]]


def _stages(
    model: torch.nn.Module,
    flags: Mapping[str, bool] | None,
    off_modules: set[str] | None,
    args: Any,
    kwargs: Any,
    loss_fn: Any,
    steps: int,
    optimizer: Any,
) -> Iterator[Stage]:
    """One run on a deep copy of `model` (made when the run starts, released when it ends): every
    tensor a training step produces, by name, a stage at a time — the step's outputs, loss and
    gradients; the parameters after the optimizer's step; at the end the buffers and the inputs.

    A stage's tensors are the run's own, not copies: read them before the run resumes.
    """
    from ..audit import default_loss

    model = _copy_with_flags(model, flags)
    for name, m in model.named_modules():
        if m.__dict__.get("inplace") is True and (off_modules is None or name in off_modules):
            m.inplace = False
    args, kwargs = _clone_inputs(args), _clone_inputs(kwargs)
    opt = _make_optimizer(optimizer, model.parameters())
    inputs = labelled_tensors(args, kwargs)
    for step in range(1, steps + 1):
        tag = f" (step {step})" if steps > 1 else ""
        output = model(*args, **kwargs)
        stage = [(f"output[{i}]{tag}", t.detach().clone()) for i, t in enumerate(tensors_in(output))]
        loss = loss_fn(output) if loss_fn is not None else default_loss(output)
        del output
        if isinstance(loss, torch.Tensor) and loss.requires_grad:
            stage.append((f"loss{tag}", loss.detach()))
            loss.backward()
        del loss
        stage += [(f"grad of {name}{tag}", p.grad) for name, p in model.named_parameters() if p.grad is not None]
        stage += [(f"grad of input {label}{tag}", t.grad) for label, t in inputs if t.grad is not None]
        yield stage
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
            yield [(f"parameter {name} after step {step}", p.detach()) for name, p in model.named_parameters()]
    yield [(f"buffer {name}", b.detach()) for name, b in model.named_buffers()]
    yield [(f"input {label} after the call", t.detach()) for label, t in inputs]


def _isolated(stages: Iterator[Stage], start: RngState, mode: "_Functional") -> Iterator[Stage]:
    """`stages` run with an RNG stream of their own (from `start`) and under `mode`, so that two
    runs can advance in turns and each still sees what it would have seen alone."""
    state = start
    while True:
        state.restore()
        with mode:
            try:
                stage = next(stages)
            except StopIteration:
                return
        state = RngState()
        yield stage


def _compare_stage(a: Stage, b: Stage, atol: float, rtol: float) -> list[Difference]:
    differences = []
    theirs = dict(b)
    for name, x in a:
        if name not in theirs:
            differences.append(Difference(f"{name} (present in only one run)", float("inf"), float("inf")))
            continue
        difference = _difference(name, x, theirs.pop(name), atol, rtol)
        if difference is not None:
            differences.append(difference)
    differences += [Difference(f"{name} (present in only one run)", float("inf"), float("inf")) for name in theirs]
    return differences


def _difference(name: str, x: torch.Tensor, y: torch.Tensor, atol: float, rtol: float) -> Difference | None:
    if x.shape != y.shape or x.dtype != y.dtype:
        return Difference(f"{name} (shape/dtype {tuple(x.shape)}/{x.dtype} vs {tuple(y.shape)}/{y.dtype})", float("inf"), float("inf"))
    if torch.equal(x, y):
        return None
    xf, yf = x.double(), y.double()
    diff = (xf - yf).abs()
    both_nan = torch.isnan(xf) & torch.isnan(yf)
    diff = torch.where(both_nan, torch.zeros_like(diff), diff)
    if bool((diff <= atol + rtol * yf.abs()).all()):
        return None
    max_abs = float(diff.max())
    max_rel = float((diff / yf.abs().clamp_min(1e-30)).max())
    return Difference(name, max_abs, max_rel)


class _ConfiguredRaised(Exception):
    def __init__(self, error: RuntimeError) -> None:
        super().__init__(str(error))
        self.error = error


def _compare_runs(
    configured: Iterator[Stage], reference: Iterator[Stage], atol: float, rtol: float, first_only: bool = False
) -> list[Difference]:
    """Advance both runs a stage at a time and compare as they go: neither run is recorded, so
    verifying costs two live copies of the model, not two copies plus everything they produced.
    A RuntimeError from the configured run is raised as `_ConfiguredRaised`."""
    differences: list[Difference] = []
    done = object()
    while True:
        try:
            a = next(configured, done)
        except RuntimeError as e:
            raise _ConfiguredRaised(e) from e
        b = next(reference, done)
        if a is done or b is done:  # together: both runs take the same steps
            return differences
        differences += _compare_stage(a, b, atol, rtol)  # type: ignore[arg-type]
        del a, b  # a run's stage may hold its gradients: let the run free them when it steps
        if first_only and differences:
            return differences


def verify(
    model: torch.nn.Module,
    *args: Any,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    steps: int = 1,
    optimizer: Any = None,
    atol: float = ATOL,
    rtol: float = RTOL,
    localize: bool = True,
    inplace_calls_off: Iterable[str] = (),
    **kwargs: Any,
) -> VerifyResult:
    """Check that the in-place configuration of `model` computes what its out-of-place form does.

    Args:
        model: the model as configured; it is never modified (every run uses a deep copy).
        *args, **kwargs: its inputs (cloned for each run).
        loss_fn: maps the output to a scalar; default: the sum of floating outputs.
        steps: training steps per run; with `optimizer`, parameters are compared after each.
        optimizer: a `torch.optim.Optimizer` (its type and defaults are reused on each copy)
            or a callable `params -> optimizer`.
        atol, rtol: tolerances; the differences reported are exact either way.
        localize: when the runs differ, find the responsible in-place sites.
        inplace_calls_off: functional `inplace=True` calls (`file:line`, as in
            `result.sites`) to run as `inplace=False` in the configured run too,
            as if their line were changed (what `optimize` asks of the user).

    Example:
        >>> from inplace_doctor.examples import ResidualReLU
        >>> result = ipd.verify(ResidualReLU(), torch.randn(4, 8))
        >>> bool(result), [str(c) for c in result.culprits]
        (False, ['module act (inplace=True)'])
    """
    return _verify(
        model, args, kwargs, loss_fn=loss_fn, steps=steps, optimizer=optimizer, atol=atol, rtol=rtol,
        localize=localize, inplace_calls_off=inplace_calls_off, flags=None,
    )


def _verify(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None,
    steps: int,
    optimizer: Any,
    atol: float,
    rtol: float,
    localize: bool,
    inplace_calls_off: Iterable[str],
    flags: Mapping[str, bool] | None,
) -> VerifyResult:
    """`verify`, with `flags` (module path -> inplace) applied to each copy first: `optimize`
    verifies a configuration without building it on a copy of its own.

    Memory: the two runs advance in turns, each on its own copy, and are compared stage by
    stage, so nothing is recorded; localising culprits records one baseline run and compares
    each probe with it.
    """
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"verify() needs a torch.nn.Module, got {type(model).__name__}")
    if steps < 1:
        raise UsageError(f"steps must be at least 1, got {steps}")
    rng = RngState()
    result = VerifyResult(equivalent=True)
    calls_off = set(inplace_calls_off)

    def run(off_modules: set[str] | None, off_calls: set[str] | None) -> tuple[Iterator[Stage], _Functional]:
        """A run, not started yet: `off_modules`/`off_calls` forced out of place (None: all)."""
        mode = _Functional(None if off_calls is None else off_calls | calls_off)
        result.runs += 1
        stages = _stages(model, flags, off_modules, args, kwargs, loss_fn, steps, optimizer)
        return _isolated(stages, rng, mode), mode

    try:
        configured, discovery = run(set(), set())
        baseline, _ = run(None, None)
        raised = None
        try:
            result.differences = _compare_runs(configured, baseline, atol, rtol)
        except _ConfiguredRaised as e:
            raised = f"{type(e.error).__name__}: {str(e.error).splitlines()[0] if str(e.error) else ''}"
        del configured, baseline  # both copies released before anything else runs
        if raised is not None:
            return _configured_raised(model, flags, args, kwargs, loss_fn, raised, result)
        result.sites = _module_sites(model, flags) + [InplaceSite("call", w) for w in discovery.seen]
        result.equivalent = not result.differences
        if result.differences and localize:
            reference = [[(name, t.clone()) for name, t in stage] for stage in run(None, None)[0]]
            result.culprits = _localize(result.sites, reference, run, atol, rtol)
    finally:
        rng.restore()
    return result


def _configured_raised(
    model: torch.nn.Module,
    flags: Mapping[str, bool] | None,
    args: Any,
    kwargs: Any,
    loss_fn: Any,
    error: str,
    result: VerifyResult,
) -> VerifyResult:
    from ..audit import audit

    result.equivalent = False
    result.error = error
    try:
        report = audit(_copy_with_flags(model, flags), *_clone_inputs(args), loss_fn=loss_fn, **_clone_inputs(kwargs))
        result.findings = report.findings
    except Exception:  # the audit itself could not run: the error above says what happened
        pass
    return result


def _localize(
    sites: list[InplaceSite],
    baseline: list[Stage],
    run: Callable[[set[str] | None, set[str] | None], tuple[Iterator[Stage], Any]],
    atol: float,
    rtol: float,
    limit: int = 8,
) -> list[InplaceSite]:
    """Binary search for the smallest prefix of sites that, switched off, matches the baseline; repeat."""

    def matches(off: list[InplaceSite]) -> bool:
        modules = {s.where for s in off if s.kind == "module"}
        calls = {s.where for s in off if s.kind == "call"}
        probe, _ = run(modules, calls)
        try:
            return not _compare_runs(probe, iter(baseline), atol, rtol, first_only=True)
        except _ConfiguredRaised:
            return False

    culprits: list[InplaceSite] = []
    remaining = list(sites)
    while remaining and len(culprits) < limit:
        if culprits and matches(culprits):
            break
        low, high = 1, len(remaining)  # matches(culprits + remaining[:high]) holds: that is the baseline
        while low < high:
            middle = (low + high) // 2
            if matches(culprits + remaining[:middle]):
                high = middle
            else:
                low = middle + 1
        culprits.append(remaining[low - 1])
        # With it off, switching off the whole prefix before it matched: any other
        # culprit is in that prefix.
        remaining = remaining[: low - 1]
    return culprits


__all__ = ["Difference", "InplaceSite", "VerifyResult", "verify"]
