"""Spike for issue 26: what do the fast tracer's two mechanisms cost, next to plain and today's `watch`?

    python benchmarks/fast_spike.py            # ~2 min on 2 shared cores
    python benchmarks/fast_spike.py --quick    # ~40 s, noisier

Variants, each one forward + backward of `benchmarks/overhead.py`'s workloads:

- plain:    no instrumentation;
- anomaly:  `detect_anomaly(check_nan=False)`, the cheapest anomaly mode;
- kernels:  a Python kernel at `ADInplaceOrView` for every mutating aten
            overload (`trace/fast/write_kernels.py`), a recorder that counts writes;
- pack:     `saved_tensors_hooks` whose pack captures the C-level stack
            (`gather_traceback`) into a small holder around `t.detach()`, and
            whose unpack re-checks the version (as the fast tracer must);
- both:     kernels and pack together: the fast tracer's floor;
- watch:    today's `inplace_doctor.watch()` (every op through a dispatch mode).

Method as in overhead.py: one thread, CPU time, warm-up, interleaved rounds
in rotating order, minimum per variant. The kernels are registered once before
timing (their registration is timed separately and printed). This script
prints measurements; it asserts nothing about them.
"""

from __future__ import annotations

import argparse
import gc
import time
import warnings
from typing import Any

import torch
from overhead import WORKLOADS, Workload, count_ops

import inplace_doctor as ipd
from inplace_doctor._compat import gather_traceback
from inplace_doctor.trace.fast.write_kernels import WriteKernels, registered

VARIANTS = ("plain", "anomaly", "kernels", "pack", "both", "watch")


class _Saved:
    __slots__ = ("t", "version", "stack")

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t.detach()
        self.version = t._version
        self.stack = gather_traceback(True, False, False)


def _unpack(saved: _Saved) -> torch.Tensor:
    if saved.t._version != saved.version:
        raise RuntimeError("modified by an inplace operation")
    return saved.t


class Counts:
    writes = 0
    saves = 0


def _record(op: Any, written: list[torch.Tensor]) -> None:
    Counts.writes += 1


def _pack(t: torch.Tensor) -> _Saved:
    Counts.saves += 1
    return _Saved(t)


def step(w: Workload) -> None:
    w.model(w.x).sum().backward()


def run(w: Workload, variant: str) -> None:
    if variant == "plain":
        step(w)
    elif variant == "anomaly":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autograd.detect_anomaly(check_nan=False):
                step(w)
    elif variant == "kernels":
        with WriteKernels(_record):
            step(w)
    elif variant == "pack":
        with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
            step(w)
    elif variant == "both":
        with WriteKernels(_record), torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
            step(w)
    else:
        with ipd.watch():
            step(w)


def timed(w: Workload, variant: str) -> float:
    w.model.zero_grad(set_to_none=True)
    gc.collect()
    start = time.process_time()
    run(w, variant)
    return time.process_time() - start


def measure(w: Workload, budget_s: float, warmup: int) -> dict[str, float]:
    gc.collect()
    gc.freeze()
    for _ in range(warmup):
        for v in VARIANTS:
            timed(w, v)
    best = {v: timed(w, v) for v in VARIANTS}
    rounds = max(3, min(200, int(budget_s / sum(best.values()))))
    for r in range(rounds):
        for i in range(len(VARIANTS)):
            v = VARIANTS[(r + i) % len(VARIANTS)]
            best[v] = min(best[v], timed(w, v))
    best["rounds"] = rounds
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    budget, warmup = (8.0, 1) if args.quick else (30.0, 2)

    start = time.perf_counter()
    keep = WriteKernels(_record).__enter__()  # registered once for the whole run
    print(f"registering {registered()} kernels took {(time.perf_counter() - start) * 1e3:.0f} ms (wall)")
    rows = []
    for build in WORKLOADS:
        w = build()
        ops = count_ops(w)
        w.model.zero_grad(set_to_none=True)
        Counts.writes = Counts.saves = 0
        run(w, "both")
        writes, saves = Counts.writes, Counts.saves
        best = measure(w, budget, warmup)
        rows.append((w.name, ops, writes, saves, best))
        print(f"{w.name}: {int(best['rounds'])} rounds, {ops} ops, {writes} writes, {saves} saves, plain {best['plain'] * 1e3:.2f} ms")
        for v in VARIANTS[1:]:
            extra = (best[v] - best["plain"]) * 1e6
            print(f"  {v:8s} x{best[v] / best['plain']:.3f}   +{extra:8.0f} µs")
    keep.__exit__(None, None, None)


if __name__ == "__main__":
    main()
