"""Comparing two runs stage by stage: which tensors differ, and by how much beyond the tolerances."""

from __future__ import annotations

from typing import Iterator

import torch

from .result import Difference
from .run import Stage

ATOL, RTOL = 1e-6, 1e-5  # verify's default tolerances


def compare_stage(a: Stage, b: Stage, atol: float, rtol: float) -> list[Difference]:
    """The differences between two runs' versions of one stage (a tensor only one has differs)."""
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


class ConfiguredRaised(Exception):
    """The configured run raised a RuntimeError (kept as `error`) while being compared."""

    def __init__(self, error: RuntimeError) -> None:
        super().__init__(str(error))
        self.error = error


def compare_runs(
    configured: Iterator[Stage], reference: Iterator[Stage], atol: float, rtol: float, first_only: bool = False
) -> list[Difference]:
    """Advance both runs a stage at a time and compare as they go: neither run is recorded, so
    verifying costs two live copies of the model, not two copies plus everything they produced.
    A RuntimeError from the configured run is raised as `ConfiguredRaised`."""
    differences: list[Difference] = []
    done = object()
    while True:
        try:
            a = next(configured, done)
        except RuntimeError as e:
            raise ConfiguredRaised(e) from e
        b = next(reference, done)
        if a is done or b is done:  # together: both runs take the same steps
            return differences
        differences += compare_stage(a, b, atol, rtol)  # type: ignore[arg-type]
        del a, b  # a run's stage may hold its gradients: let the run free them when it steps
        if first_only and differences:
            return differences
