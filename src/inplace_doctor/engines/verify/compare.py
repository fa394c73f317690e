"""Comparing two runs stage by stage: which tensors differ, and by how much beyond the tolerances."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .result import Difference, Differences
from .run import Stage

ATOL, RTOL = 1e-6, 1e-5  # verify's default tolerances


def compare_stage(
    a: Stage, b: Stage, atol: float, rtol: float, notes: list[str] | None = None
) -> list[Difference]:
    """The differences between two runs' versions of one stage (a tensor only one has differs).

    NaN and inf are compared by position: the same non-finite value in the same place on both
    sides is equal. A tensor holding NaN/inf in both runs at the same places is no difference;
    it is described in `notes`, when given."""
    differences = []
    theirs = dict(b)
    for name, x in a:
        if name not in theirs:
            differences.append(Difference(f"{name} (present in only one run)", float("inf"), float("inf")))
            continue
        y = theirs.pop(name)
        difference = _difference(name, x, y, atol, rtol)
        if difference is not None:
            differences.append(difference)
        if notes is not None and (difference is None or not difference.nonfinite) and x.shape == y.shape and x.dtype == y.dtype:
            note = _same_nonfinite_note(name, x)
            if note is not None:
                notes.append(note)
    differences += [Difference(f"{name} (present in only one run)", float("inf"), float("inf")) for name in theirs]
    return differences


def _difference(name: str, x: torch.Tensor, y: torch.Tensor, atol: float, rtol: float) -> Difference | None:
    if x.shape != y.shape or x.dtype != y.dtype:
        return Difference(f"{name} (shape/dtype {tuple(x.shape)}/{x.dtype} vs {tuple(y.shape)}/{y.dtype})", float("inf"), float("inf"))
    if torch.equal(x, y):
        return None
    xf, yf = x.double(), y.double()
    if not (bool(torch.isfinite(xf).all()) and bool(torch.isfinite(yf).all())):
        return _nonfinite_difference(name, xf, yf, atol, rtol)
    diff = (xf - yf).abs()
    both_nan = torch.isnan(xf) & torch.isnan(yf)
    diff = torch.where(both_nan, torch.zeros_like(diff), diff)
    if bool((diff <= atol + rtol * yf.abs()).all()):
        return None
    max_abs = float(diff.max())
    max_rel = float((diff / yf.abs().clamp_min(1e-30)).max())
    return Difference(name, max_abs, max_rel)


def _count(n: int) -> str:
    return f"{n} element" if n == 1 else f"{n} elements"


def _nonfinite_difference(name: str, xf: torch.Tensor, yf: torch.Tensor, atol: float, rtol: float) -> Difference | None:
    """`_difference` when either side holds NaN/inf: equal where both hold the same non-finite
    value; finite elements compared with the same tolerances; `max_abs`/`max_rel` over the
    elements finite on both sides (0 when there are none)."""
    x_nan, y_nan = torch.isnan(xf), torch.isnan(yf)
    x_inf, y_inf = torch.isinf(xf), torch.isinf(yf)
    nan_once = int((x_nan ^ y_nan).sum())
    inf_once = int(((x_inf ^ y_inf) & ~x_nan & ~y_nan).sum())
    inf_signs = int((x_inf & y_inf & (xf != yf)).sum())
    finite = torch.isfinite(xf) & torch.isfinite(yf)
    fx, fy = xf[finite], yf[finite]
    diff = (fx - fy).abs()
    within = bool((diff <= atol + rtol * fy.abs()).all())
    if not (nan_once or inf_once or inf_signs) and within:
        return None
    max_abs = float(diff.max()) if diff.numel() else 0.0
    max_rel = float((diff / fy.abs().clamp_min(1e-30)).max()) if diff.numel() else 0.0
    parts = []
    if nan_once:
        parts.append(f"NaN in one run only at {_count(nan_once)}")
    if inf_once:
        parts.append(f"inf in one run only at {_count(inf_once)}")
    if inf_signs:
        parts.append(f"inf of opposite signs at {_count(inf_signs)}")
    return Difference(name, max_abs, max_rel, nonfinite=", ".join(parts))


def _same_nonfinite_note(name: str, x: torch.Tensor) -> str | None:
    """For two tensors whose NaN/inf are in the same places: a note when there are any, else None."""
    if not (x.is_floating_point() or x.is_complex()) or bool(torch.isfinite(x).all()):
        return None
    nan = int(torch.isnan(x).sum())
    inf = int(torch.isinf(x).sum())
    kinds = " and ".join(k for k, n in (("NaN", nan), ("inf", inf)) if n)
    return f"both runs have {kinds} in {name} at the same places ({_count(int((~torch.isfinite(x)).sum()))})"


class ConfiguredRaised(Exception):
    """The configured run raised a RuntimeError (kept as `error`) while being compared."""

    def __init__(self, error: RuntimeError) -> None:
        super().__init__(str(error))
        self.error = error


def compare_runs(
    configured: Iterator[Stage], reference: Iterator[Stage], atol: float, rtol: float, first_only: bool = False
) -> Differences:
    """Advance both runs a stage at a time and compare as they go: neither run is recorded, so
    verifying costs two live copies of the model, not two copies plus everything they produced.
    A RuntimeError from the configured run is raised as `ConfiguredRaised`, unless the reference
    run raises at the same stage: then the reference's error is the program's, raised as it is. The answer is a list
    of the differences whose `notes` describe tensors holding NaN/inf in both runs at the same
    places (no difference)."""
    differences = Differences()
    done = object()
    while True:
        try:
            a = next(configured, done)
        except RuntimeError as e:
            next(reference, done)  # raises too when the out-of-place program fails the same way:
            raise ConfiguredRaised(e) from e  # then that is the program's own error, not in-place's
        b = next(reference, done)
        if a is done or b is done:  # together: both runs take the same steps
            return differences
        differences += compare_stage(a, b, atol, rtol, differences.notes)  # type: ignore[arg-type]
        del a, b  # a run's stage may hold its gradients: let the run free them when it steps
        if first_only and differences:
            return differences
