"""IPD111 on CUDA: dropout's fused kernel and the CUDA generator, and kernels whose atomics may differ
in the last bits from one run to the next (a recompute that differs only by rounding is no error)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from _cpu_tests import load
from torch.utils.checkpoint import checkpoint

import inplace_doctor as ipd
from inplace_doctor.causes import RecomputeCause, RecomputeFacts

recompute = load("rules/test_ipd111_recompute.py")

pytestmark = pytest.mark.cuda


@recompute.MODES
def test_dropout_on_cuda_without_rng_preservation_is_the_rng_and_with_it_nothing(deep: bool) -> None:
    torch.manual_seed(0)
    model, x = recompute.FeedForward(preserve_rng_state=False).cuda(), torch.randn(4, 8, device="cuda")
    with recompute._watch(deep) as session:
        model(x).pow(2).sum().backward()
    [finding] = recompute._ipd111(session.findings)
    assert finding.cause is RecomputeCause.RNG and finding.severity is ipd.Severity.ERROR
    assert finding.mutation.module == "model.drop" and "preserve_rng_state=True" in finding.fix
    model.preserve = True  # the printed fix: checkpoint restores the CUDA generator too
    with recompute._watch(deep) as session:
        model(x).pow(2).sum().backward()
    assert recompute._ipd111(session.findings) == []


def _scatter_region(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """2**20 values added into 4 bins by `index_add`: on CUDA, atomics in whatever order the blocks run."""
    bins = torch.zeros(4, device=x.device).index_add(0, index, x)
    return torch.tanh(bins)  # saves its output: the recompute runs index_add again to make it


@contextlib.contextmanager
def _deterministic(on: bool) -> Iterator[None]:
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(on)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def _recompute_findings(deep: bool, tries: int) -> list[ipd.Finding]:
    """The IPD111 findings of up to `tries` forward/backward runs, stopping at the first run with one."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(2**20, device="cuda", generator=generator).requires_grad_()
    index = torch.randint(0, 4, (2**20,), device="cuda", generator=generator)
    for _ in range(tries):
        with recompute._watch(deep) as session:
            checkpoint(_scatter_region, x, index, use_reentrant=False).sum().backward()
        found = recompute._ipd111(session.findings)
        if found:
            return found
    return []


@recompute.MODES
def test_a_recompute_that_differs_by_atomics_rounding_is_a_warning_that_says_how_to_tell(deep: bool) -> None:
    with _deterministic(False):
        found = _recompute_findings(deep, tries=5)
    assert found, "index_add's float atomics summed 2**20 values in the same order 5 times: nothing to check"
    for finding in found:
        assert finding.cause is RecomputeCause.UNKNOWN and finding.severity is ipd.Severity.WARNING
        assert isinstance(finding.facts, RecomputeFacts) and finding.facts.nondeterministic_kernels
        assert finding.mutation.op == "aten.index_add"
        assert "differ in the last bits" in finding.why
        assert finding.fix.startswith("run once with torch.use_deterministic_algorithms(True)")


@recompute.MODES
def test_with_deterministic_algorithms_the_same_region_recomputes_exactly(deep: bool) -> None:
    """The fix the warning prints: deterministic kernels make the recompute bit-exact, and nothing is said."""
    with _deterministic(True):
        assert _recompute_findings(deep, tries=3) == []
