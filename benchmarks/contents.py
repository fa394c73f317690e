"""What do IPD109's content checks cost? The fingerprint per MiB, and `watch` with and without them.

    python benchmarks/contents.py                          # ~1-2 min on 2 cores
    python benchmarks/contents.py --baseline /tmp/ipd-main # also the code before, same run

Printed (one CPU thread, CPU time, minimum of interleaved rounds; it asserts nothing):

1. the fingerprint alone (`trace/saves/fingerprint.py`), µs per MiB, next to a `clone()` of the
   same tensor (the cost of keeping a copy instead);
2. on a small MLP and a ResNet-ish conv net, forward + backward: plain, `watch()` (by
   default only saved tensors on memory handed out by `.numpy()`/DLPack/`data_ptr()` are
   fingerprinted: none here), `watch(check_contents=True)` (every saved tensor, at save and
   at unpack), as ratios to plain, and what check_contents adds per saved MiB;
3. with `--baseline DIR` (a checkout of the code before, e.g. `git worktree add DIR main`):
   `watch`/plain measured by this checkout and by DIR's, in child processes that alternate,
   so the default overhead before and after is compared in one run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve()


def best_of(fn: Callable[[], object], rounds: int) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def fingerprint_cost(rounds: int) -> list[tuple[int, float, float]]:
    from inplace_doctor.trace.saves.fingerprint import fingerprint

    rows = []
    for mib in (1, 16, 64):
        t = torch.randn(mib * 2**18)  # float32
        rows.append((mib, best_of(lambda: fingerprint(t), rounds) / mib * 1e6,  # noqa: B023 (timed now)
                     best_of(lambda: t.clone(), rounds) / mib * 1e6))  # noqa: B023
    return rows


def mlp() -> tuple[str, nn.Module, torch.Tensor]:
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    return "MLP 8 x Linear(256, 256) + ReLU, batch 64", nn.Sequential(*layers), torch.randn(64, 256)


def resnetish() -> tuple[str, nn.Module, torch.Tensor]:
    from torchvision.models import resnet18

    return "ResNet-18, batch 4, 64 px", resnet18(num_classes=10), torch.randn(4, 3, 64, 64)


def saved_mib(model: nn.Module, x: torch.Tensor) -> float:
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x).sum()
    del out
    return total / 2**20


def step_times(variants: tuple[str, ...], rounds: int) -> dict[str, dict[str, float]]:
    """{workload: {variant: best CPU seconds}}, variants interleaved in rotating order."""
    import inplace_doctor as ipd

    runners: dict[str, Callable[[nn.Module, torch.Tensor], None]] = {
        "plain": lambda m, x: m(x).sum().backward(),
    }

    def watched(check: bool) -> Callable[[nn.Module, torch.Tensor], None]:
        def run(m: nn.Module, x: torch.Tensor) -> None:
            kwargs = {"check_contents": True} if check else {}
            with ipd.watch(**kwargs):
                m(x).sum().backward()
        return run

    runners["watch"] = watched(False)
    runners["contents"] = watched(True)
    results: dict[str, dict[str, float]] = {}
    for build in (mlp, resnetish):
        name, model, x = build()
        model.train()
        gc.collect()
        gc.freeze()
        best = {v: float("inf") for v in variants}
        for r in range(rounds + 1):
            for i in range(len(variants)):
                v = variants[(r + i) % len(variants)]
                model.zero_grad(set_to_none=True)
                gc.collect()
                start = time.process_time()
                runners[v](model, x)
                elapsed = time.process_time() - start
                if r:  # the first round warms up
                    best[v] = min(best[v], elapsed)
        best["saved_mib"] = saved_mib(model, x)
        results[name] = best
    return results


def child(rounds: int) -> None:
    """Run by --baseline: plain and watch only (the code before has no check_contents)."""
    torch.set_num_threads(1)
    print(json.dumps(step_times(("plain", "watch"), rounds)))


def compare(baseline: Path, rounds: int, repeats: int) -> dict[str, dict[str, list[float]]]:
    """watch/plain per workload, from alternating child processes of each checkout."""
    mine = HERE.parents[1] / "src"
    ratios: dict[str, dict[str, list[float]]] = {}
    for _ in range(repeats):
        for label, src in (("before", baseline / "src"), ("after", mine)):
            env = {**os.environ, "PYTHONPATH": str(src)}
            done = subprocess.run(
                [sys.executable, str(HERE), "--child", "--rounds", str(rounds)],
                capture_output=True, text=True, env=env, check=True,
            )
            for name, best in json.loads(done.stdout.strip().splitlines()[-1]).items():
                ratios.setdefault(name, {}).setdefault(label, []).append(best["watch"] / best["plain"])
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds per workload")
    parser.add_argument("--baseline", type=Path, help="a checkout of the code before, to compare watch's default cost")
    parser.add_argument("--repeats", type=int, default=3, help="alternations of the two checkouts with --baseline")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.rounds)
        return
    torch.set_num_threads(1)
    torch.manual_seed(0)
    import inplace_doctor as ipd

    print(f"torch {torch.__version__}, inplace-doctor {ipd.__version__}, threads 1, CPU time\n")
    print("| tensor | fingerprint (µs per MiB) | clone (µs per MiB) |\n|---|--:|--:|")
    for mib, fp, clone in fingerprint_cost(args.rounds):
        print(f"| {mib} MiB float32 | {fp:.0f} | {clone:.0f} |")
    results = step_times(("plain", "watch", "contents"), args.rounds)
    print("\n| workload | plain (ms) | watch | watch, check_contents | saved MiB | check_contents µs per saved MiB |")
    print("|---|--:|--:|--:|--:|--:|")
    for name, best in results.items():
        per_mib = (best["contents"] - best["watch"]) / best["saved_mib"] * 1e6
        print(
            f"| {name} | {best['plain'] * 1e3:.1f} | x{best['watch'] / best['plain']:.2f}"
            f" | x{best['contents'] / best['plain']:.2f} | {best['saved_mib']:.1f} | {per_mib:.0f} |"
        )
    if args.baseline is not None:
        ratios = compare(args.baseline, args.rounds, args.repeats)
        print("\nwatch / plain, default options, code before and after, alternating child processes:\n")
        print("| workload | before (min, runs) | after (min, runs) |\n|---|--:|--:|")
        for name, by in ratios.items():
            cells = [f"x{min(by[k]):.2f} ({', '.join(f'{v:.2f}' for v in by[k])})" for k in ("before", "after")]
            print(f"| {name} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
