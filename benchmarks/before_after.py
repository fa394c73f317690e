"""Did `watch` get slower? This checkout against an earlier revision, in one process, interleaved.

    . .venv/bin/activate && python benchmarks/before_after.py 0a60e0d          # ~3-5 min on 2 cores
    python benchmarks/before_after.py 0a60e0d --quick                          # ~1-2 min, noisier

Two runs of `overhead.py` minutes apart differ by several percent on these
machines, in either direction, so comparing their printed ratios cannot tell a
5 % growth from noise. This script measures both revisions in the same rounds:
the earlier revision's package is extracted with `git archive` into a temporary
folder as `inplace_doctor_before` (the package imports itself only relatively,
so both load side by side), and every round runs every variant once, in a
rotating order, on the same model and input.

Variants, each one forward + backward with `loss = output.sum()` on the
workloads of `overhead.py` (ResNet-50, the TransformerEncoder, the MLP):

- plain: no instrumentation;
- watch@REV / watch: `watch()` with its defaults, earlier revision / this checkout,
  a watch per step: the timed step follows an untimed watched step, as in a
  training loop that opens one per step (the fast tracer's kernels, registered
  by the first, linger into the next where the revision has the linger);
- deep@REV / deep: `watch(deep=True)`, where the revision has the keyword (the
  per-op tracer, compared with itself).

Every variant starts with no kernels lingering (`end_linger()`, untimed, in each
package that has it): plain runs without them, and no deep watch pays their
removal.

Reported: the minimum CPU time per variant over the rounds, its ratio to plain,
and now/before for each pair. This script prints measurements; it asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import inspect
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

sys.path.insert(0, str(Path(__file__).parent))
from overhead import WORKLOADS, Workload  # noqa: E402

import inplace_doctor as ipd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S, QUICK_BUDGET_S = 40.0, 12.0


def load_revision(rev: str, into: Path) -> ModuleType:
    """The package as it was at `rev`, importable as `inplace_doctor_before`."""
    archive = into / "src.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src/inplace_doctor"], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    (into / "src" / "inplace_doctor").rename(into / "inplace_doctor_before")
    sys.path.insert(0, str(into))
    return importlib.import_module("inplace_doctor_before")


def variants(before: ModuleType) -> dict[str, Callable[[Workload], None]]:
    def plain(w: Workload) -> None:
        w.model(w.x).sum().backward()

    def under(watch: Callable[..., object], **kwargs: object) -> Callable[[Workload], None]:
        def run(w: Workload) -> None:
            with watch(**kwargs):  # type: ignore[attr-defined]
                w.model(w.x).sum().backward()

        return run

    runs = {"plain": plain, "watch@REV": under(before.watch), "watch": under(ipd.watch)}
    if "deep" in inspect.signature(before.watch).parameters:
        runs["deep@REV"] = under(before.watch, deep=True)
        runs["deep"] = under(ipd.watch, deep=True)
    return runs


def lingers_ended(*packages: ModuleType) -> Callable[[], None]:
    """Removes the fast tracer's lingering kernels, in each package that has a linger."""

    def end() -> None:
        for package in packages:
            kernels = sys.modules.get(f"{package.__name__}.trace.write_kernels")
            end_linger = getattr(kernels, "end_linger", None)
            if end_linger is not None:
                end_linger()

    return end


def timed(w: Workload, name: str, run: Callable[[Workload], None], end_lingers: Callable[[], None]) -> float:
    end_lingers()
    if name.startswith("watch"):
        w.model.zero_grad(set_to_none=True)
        run(w)  # the step before: a watch per step
    w.model.zero_grad(set_to_none=True)
    gc.collect()
    start = time.process_time()
    run(w)
    return time.process_time() - start


def measure(
    w: Workload, runs: dict[str, Callable[[Workload], None]], budget_s: float, end_lingers: Callable[[], None],
) -> dict[str, float]:
    gc.collect()
    gc.freeze()
    names = list(runs)
    best = {name: timed(w, name, runs[name], end_lingers) for name in names}  # warm-up, then sizing
    once = {name: timed(w, name, runs[name], end_lingers) for name in names}
    rounds = max(3, min(200, int(budget_s / sum(once.values()))))
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            best[name] = min(best[name], timed(w, name, runs[name], end_lingers))
    print(f"  {rounds} rounds", flush=True)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the earlier revision (a commit, tag or branch)")
    parser.add_argument("--quick", action="store_true", help="smaller time budget; noisier")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        before = load_revision(args.rev, Path(tmp))
        runs = variants(before)
        end_lingers = lingers_ended(ipd, before)
        print(f"torch {torch.__version__}; before: {args.rev}; now: this checkout; one thread, CPU time")
        rows = []
        for build in WORKLOADS:
            w = build()
            print(f"measuring {w.name} ...", flush=True)
            best = measure(w, runs, QUICK_BUDGET_S if args.quick else BUDGET_S, end_lingers)
            rows.append((w.name, best))
    pairs = [p for p in ("watch", "deep") if p in runs]
    header = "| workload | plain (ms) | " + " | ".join(f"{p}@REV | {p} | now / before" for p in pairs) + " |"
    print("\n" + header.replace("REV", args.rev))
    print("|---|--:|" + "--:|--:|--:|" * len(pairs))
    for name, best in rows:
        cells = []
        for p in pairs:
            old, new = best[f"{p}@REV"] / best["plain"], best[p] / best["plain"]
            cells.append(f"x{old:.2f} | x{new:.2f} | {new / old:.3f}")
        print(f"| {name} | {best['plain'] * 1e3:.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
