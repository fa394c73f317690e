"""`verify`: does an in-place configuration compute exactly what the out-of-place program does?

Runs the model as configured and as an out-of-place baseline (every module
`inplace` flag and every functional `inplace=True` argument forced off for the
run, without editing code; explicit `relu_()` and `+=` are the program's
meaning and stay), each on a deep copy, with cloned inputs and the same RNG
stream, and compares everything a training step produces. The two runs advance
in turns and are compared stage by stage, so verifying holds two copies of the
model and their optimizer state, never a recording of a run. When they differ,
the responsible in-place sites are found by group testing (localize.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from ...errors import UsageError
from ..audit import audit
from ..preserve import RngState, refuse_meta, tensors_in
from ..training import LossFn, copy_for_training
from .compare import ATOL, RTOL, ConfiguredRaised, compare_runs
from .localize import localize as find_culprits
from .result import InplaceSite, VerifyResult
from .run import FunctionalInplace, Stage, clone_inputs, isolated, module_sites, stages


def verify(
    model: torch.nn.Module,
    *args: Any,
    loss_fn: LossFn | None = None,
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
    _check_tolerance("atol", atol)
    _check_tolerance("rtol", rtol)
    return verify_configuration(
        model, args, kwargs, loss_fn=loss_fn, steps=steps, optimizer=optimizer, atol=atol, rtol=rtol,
        localize=localize, inplace_calls_off=inplace_calls_off, flags=None,
    )


def _check_tolerance(name: str, value: float) -> None:
    """A tolerance is a finite number >= 0: an infinite one calls any two runs equivalent."""
    try:
        finite = math.isfinite(value) and value >= 0
    except TypeError:
        finite = False
    if not finite:
        raise UsageError(
            f"verify's {name}={value!r} is not a finite number >= 0 (an infinite or NaN tolerance calls any two "
            f"runs equivalent); pass e.g. {name}={ATOL if name == 'atol' else RTOL}"
        )


def verify_configuration(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    loss_fn: LossFn | None,
    steps: int,
    optimizer: Any,
    atol: float = ATOL,
    rtol: float = RTOL,
    localize: bool = True,
    inplace_calls_off: Iterable[str] = (),
    flags: Mapping[str, bool] | None = None,
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
    refuse_meta(model, tensors_in((args, kwargs)), "verify")
    rng = RngState()
    result = VerifyResult(equivalent=True)
    calls_off = set(inplace_calls_off)

    def run(off_modules: set[str] | None, off_calls: set[str] | None) -> tuple[Iterator[Stage], FunctionalInplace]:
        """A run, not started yet: `off_modules`/`off_calls` forced out of place (None: all)."""
        mode = FunctionalInplace(None if off_calls is None else off_calls | calls_off)
        result.runs += 1
        run_stages = stages(model, flags, off_modules, args, kwargs, loss_fn, steps, optimizer)
        return isolated(run_stages, rng, mode), mode

    try:
        configured, discovery = run(set(), set())
        baseline, _ = run(None, None)
        raised = None
        try:
            result.differences = compare_runs(configured, baseline, atol, rtol)
        except ConfiguredRaised as e:
            raised = f"{type(e.error).__name__}: {str(e.error).splitlines()[0] if str(e.error) else ''}"
        del configured, baseline  # both copies released before anything else runs
        if raised is not None:
            return _configured_raised(model, flags, args, kwargs, loss_fn, raised, result)
        result.sites = module_sites(model, flags) + [InplaceSite("call", w) for w in discovery.seen]
        result.equivalent = not result.differences
        if result.differences and localize:
            reference = [[(name, t.clone()) for name, t in stage] for stage in run(None, None)[0]]
            result.culprits = find_culprits(result.sites, reference, run, atol, rtol)
    finally:
        rng.restore()
    return result


def _configured_raised(
    model: torch.nn.Module,
    flags: Mapping[str, bool] | None,
    args: Any,
    kwargs: Any,
    loss_fn: LossFn | None,
    error: str,
    result: VerifyResult,
) -> VerifyResult:
    """The result when the configured run raised: the error, and the findings an audit of it gives."""
    result.equivalent = False
    result.error = error
    try:
        configured, _ = copy_for_training(model, flags=flags)
        copied_args, copied_kwargs = clone_inputs((args, kwargs))
        report = audit(configured, *copied_args, loss_fn=loss_fn, **copied_kwargs)
        result.findings = report.findings
    except Exception:  # the audit itself could not run: the error above says what happened
        pass
    return result
