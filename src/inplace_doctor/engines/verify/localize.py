"""Finding the culprits when the runs differ: the in-place sites that, switched off, give the baseline's results.

Group testing: a binary search for the smallest prefix of sites that, switched off, matches a
recorded baseline run; the last site of that prefix is a culprit; repeat on the sites before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from .compare import ConfiguredRaised, compare_runs
from .result import InplaceSite
from .run import Stage

# A run, not started yet, with the given module flags and functional calls forced off.
RunFactory = Callable[[set[str] | None, set[str] | None], tuple[Iterator[Stage], Any]]


def localize(
    sites: list[InplaceSite],
    baseline: list[Stage],
    run: RunFactory,
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
            return not compare_runs(probe, iter(baseline), atol, rtol, first_only=True)
        except ConfiguredRaised:
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
