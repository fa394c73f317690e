"""What does inplace-doctor cost, next to a plain forward + backward and anomaly mode?

    . .venv/bin/activate && python benchmarks/overhead.py            # ~2-4 min on 2 cores
    python benchmarks/overhead.py --quick                             # ~1 min, noisier
    python benchmarks/overhead.py --rounds 20                         # fixed rounds everywhere
    python benchmarks/overhead.py --profile                           # cProfile of `watch` on the MLP
    python benchmarks/overhead.py --profile fast                      # ... of the fast tracer, per-hook µs
    python benchmarks/overhead.py --memory                            # peak RSS per variant, ResNet-50

Variants, each one forward + backward with `loss = output.sum()` (and, on the
training-step workload, cross-entropy against random labels and the optimizer's
`step()` after it):

- plain:   no instrumentation;
- anomaly: inside `torch.autograd.detect_anomaly()` (its warning silenced);
- anomaly-cheap: `detect_anomaly(check_nan=False)`, the cheapest anomaly mode;
- watch:   inside `inplace_doctor.watch(deep=True)`, the deep tracer (every aten op
           through a dispatch mode), entered and left outside the timed region as `fast`;
- fast:    inside `inplace_doctor.watch()`, the default: the fast tracer (issue 26:
           only writes, saves and torch-level calls enter Python), every rule on.
           The cost of leaving it on: like `watch`, a fresh `watch()` per round, entered
           and left outside the timed region, as a watch around a whole training run
           enters once, and the timed step is its second: the first, untimed, pays
           what a watch left on pays once (naming the model's modules, about 0.2 ms);
           its kernels' registration (printed once) is held for the whole run likewise;
- fast-per-step: the same with `with ipd.watch():` inside the timed region: what a
           watch opened and closed around every step costs (its entry and exit,
           about 1 ms, dominate small steps);
- contents: inside `inplace_doctor.watch(check_contents=True)`: every saved tensor's
           bytes fingerprinted at save and at unpack (IPD109);
- audit:   `inplace_doctor.audit(model, x)` itself (the fast tracer, by default), which
           also saves and restores the model's buffers, grads, flags and the RNG
           state around the run;
- modules: the fast tracer's module hooks alone (`trace.modules.ModulePaths`, the
           global forward pre- and post-hooks that keep module paths; naming the
           model's modules at its first call, once per `watch`, included), to split
           the fast tracer's cost: "µs per module call" is (modules - plain) / module
           calls, "µs per saved tensor" the rest of it, (fast - modules) / saved
           tensors (a save's pack and unpack, its node's hook, and the `watch`'s
           entry and exit, spread over the saves).

Method:

- `torch.set_num_threads(1)` and CPU time from `time.process_time()`: with one
  intra-op thread CPU time is close to wall time, and less disturbed by other
  processes on the machine.
- Warm-up rounds first (allocator, dispatcher and Python caches).
- One iteration of each variant is timed to size the run: each workload gets as
  many rounds as fit its share of the time budget (`--rounds` overrides).
- Then N interleaved rounds: every round runs every variant once, in a rotating
  order, so slow drift (thermal, other load) affects all variants alike.
  Grads are set to None and garbage is collected before each timed call, both
  outside the timed region; the objects alive after setup are moved out of the
  collector's reach (`gc.freeze()`), so those collections cost microseconds
  instead of a scan of all of torch's objects, and no full collection of them
  lands inside a timed call.
- Reported: the minimum time per variant (the least disturbed run) and the
  ratio min(variant) / min(plain). "µs added per op" is
  (min(watch) - min(plain)) / number of aten ops in one forward + backward,
  counted once with a pass-through `TorchDispatchMode`.
- `--memory`: each variant (plain, fast, watch, anomaly-cheap) runs N steps of
  ResNet-50 in a fresh process, which then reads its peak resident set size
  (`resource.getrusage(RUSAGE_SELF).ru_maxrss`); printed in bytes and as the
  ratio to plain's, and so is what the steps added to the RSS the process had
  before the first (every process imports the same modules first; `fast`
  registers its kernels before, as the timing rounds hold them).

This script prints measurements; it asserts nothing about them.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import resource
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import inplace_doctor as ipd
from inplace_doctor import _compat
from inplace_doctor.trace.fast.fast_writes import FastWrites
from inplace_doctor.trace.fast.saved_fast import FastSavedTensors
from inplace_doctor.trace.fast.write_kernels import WriteKernels, registered
from inplace_doctor.trace.places.modules import ModulePaths
from inplace_doctor.trace.saves.saved import SavedTensors

VARIANTS = ("plain", "anomaly", "anomaly-cheap", "watch", "fast", "fast-per-step", "audit", "contents", "modules")
MEMORY_VARIANTS = ("plain", "fast", "watch", "anomaly-cheap")

# Seconds of timed rounds per workload (the full run also spends time on
# warm-up and sizing); --quick uses the smaller budget.
BUDGET_S = 45.0
QUICK_BUDGET_S = 12.0
MIN_ROUNDS, MAX_ROUNDS = 3, 200


# -- workloads ----------------------------------------------------------------


@dataclass
class Workload:
    name: str
    model: nn.Module
    x: torch.Tensor
    optimizer: torch.optim.Optimizer | None = None
    labels: torch.Tensor | None = None  # with an optimizer: cross-entropy against these, else the sum

    def step(self) -> None:
        """One forward + backward (+ the optimizer's step): what every variant times."""
        out = self.model(self.x)
        loss = out.sum() if self.labels is None else nn.functional.cross_entropy(out, self.labels)
        loss.backward()
        if self.optimizer is not None:
            self.optimizer.step()


def resnet50() -> Workload:
    from torchvision.models import resnet50 as build

    return Workload("ResNet-50, batch 4, 160 px", build(weights=None).train(), torch.randn(4, 3, 160, 160))


def transformer() -> Workload:
    layer = nn.TransformerEncoderLayer(
        d_model=256, nhead=8, dim_feedforward=1024, dropout=0.1, batch_first=True
    )
    model = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False).train()
    return Workload("TransformerEncoder 4 x 256, batch 8, seq 64", model, torch.randn(8, 64, 256))


def mlp() -> Workload:
    layers: list[nn.Module] = []
    for _ in range(30):
        layers += [nn.Linear(64, 64), nn.GELU()]
    return Workload("MLP 30 x Linear(64, 64) + GELU, batch 16", nn.Sequential(*layers).train(), torch.randn(16, 64))


def training_step() -> Workload:
    """A real training step: torchvision's ResNet-18 (ReLU(inplace=True), BatchNorm running statistics)
    with SGD + momentum and weight decay (the optimizer's in-place updates are writes too)."""
    from torchvision.models import resnet18

    model = resnet18(weights=None, num_classes=10).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    x, labels = torch.randn(8, 3, 64, 64), torch.randint(0, 10, (8,))
    return Workload("ResNet-18 training step + SGD, batch 8, 64 px", model, x, optimizer, labels)


WORKLOADS: tuple[Callable[[], Workload], ...] = (resnet50, transformer, mlp, training_step)


# -- variants -----------------------------------------------------------------


def run_plain(w: Workload) -> None:
    w.step()


def run_anomaly(w: Workload) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Anomaly Detection has been enabled..."
        with torch.autograd.detect_anomaly():
            w.step()


def run_anomaly_cheap(w: Workload) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autograd.detect_anomaly(check_nan=False):
            w.step()


def run_fast(w: Workload) -> None:
    with ipd.watch():
        w.step()


# Variants timed inside a session entered before the timer starts and left after it stops.
STEADY: dict[str, Callable[[], object]] = {"fast": ipd.watch, "watch": lambda: ipd.watch(deep=True)}


def run_audit(w: Workload) -> None:
    ipd.audit(w.model, w.x)


def run_contents(w: Workload) -> None:
    with ipd.watch(check_contents=True):
        w.step()


def run_modules(w: Workload) -> None:
    with ModulePaths():
        w.step()


RUNNERS: dict[str, Callable[[Workload], None]] = {
    "plain": run_plain,
    "anomaly": run_anomaly,
    "anomaly-cheap": run_anomaly_cheap,
    "watch": lambda w: w.step(),
    "fast": lambda w: w.step(),
    "fast-per-step": run_fast,
    "audit": run_audit,
    "contents": run_contents,
    "modules": run_modules,
}


def run(w: Workload, variant: str) -> None:
    """One step of `variant`, its session (if any) entered and left around it."""
    if variant in STEADY:
        with STEADY[variant]():  # type: ignore[attr-defined]
            RUNNERS[variant](w)
    else:
        RUNNERS[variant](w)


def timed(w: Workload, variant: str) -> float:
    """CPU seconds of one forward + backward of `variant`."""
    session = STEADY[variant]() if variant in STEADY else None
    if session is not None:
        session.__enter__()  # type: ignore[attr-defined]
        try:  # a session left on for a run: this is not its first step
            w.model.zero_grad(set_to_none=True)
            RUNNERS[variant](w)
        except BaseException:
            session.__exit__(None, None, None)  # type: ignore[attr-defined]
            raise
    w.model.zero_grad(set_to_none=True)
    gc.collect()
    start = time.process_time()
    try:
        RUNNERS[variant](w)
        return time.process_time() - start
    finally:
        if session is not None:
            session.__exit__(None, None, None)  # type: ignore[attr-defined]


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops += 1
        return func(*args, **(kwargs or {}))


def count_ops(w: Workload) -> int:
    """Aten ops in one plain forward + backward."""
    w.model.zero_grad(set_to_none=True)
    with _CountOps() as counter:
        run_plain(w)
    return counter.ops


@dataclass
class Hooked:
    """What enters the fast tracer's Python in one forward + backward."""

    saves: int
    module_calls: int
    nodes: int


def count_hooked(w: Workload) -> Hooked:
    calls = nodes = 0

    def pre(module: nn.Module, args: object) -> None:
        nonlocal calls
        calls += 1

    def on_node(node: object) -> None:
        nonlocal nodes
        nodes += 1

    w.model.zero_grad(set_to_none=True)
    handle = torch.nn.modules.module.register_module_forward_pre_hook(pre)
    _compat.push_node_creation_hook(on_node)
    try:
        with ipd.watch() as session:
            run_plain(w)
    finally:
        _compat.pop_node_creation_hook()
        handle.remove()
    return Hooked(session.tracer.saves, calls, nodes)


def saved_mib(w: Workload) -> float:
    """MiB of the tensors autograd saves in one forward (what check_contents fingerprints)."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = w.model(w.x).sum()
    del out
    return total / 2**20


# -- measurement --------------------------------------------------------------


@dataclass
class Result:
    name: str
    rounds: int
    ops: int
    findings: int
    best: dict[str, float]
    saved_mib: float
    hooked: Hooked

    def ratio(self, variant: str) -> float:
        return self.best[variant] / self.best["plain"]

    def us_per_op(self) -> float:
        return (self.best["watch"] - self.best["plain"]) / self.ops * 1e6

    def us_per_module_call(self) -> float:
        """What the fast tracer's module hooks add per module call."""
        return (self.best["modules"] - self.best["plain"]) / self.hooked.module_calls * 1e6

    def us_per_saved_tensor(self) -> float:
        """The rest of what the fast tracer adds, per saved tensor (its node and the watch's entry included)."""
        return (self.best["fast"] - self.best["modules"]) / self.hooked.saves * 1e6

    def us_per_saved_mib(self) -> float:
        """What check_contents adds to watch, per MiB saved (fingerprinted at save and at unpack)."""
        return (self.best["contents"] - self.best["watch"]) / self.saved_mib * 1e6


def measure(w: Workload, rounds: int | None, budget_s: float, warmup: int) -> Result:
    gc.collect()
    gc.freeze()
    for _ in range(warmup):
        for v in VARIANTS:
            timed(w, v)
    once = {v: timed(w, v) for v in VARIANTS}  # sizes the run
    if rounds is None:
        rounds = int(budget_s / sum(once.values()))
        rounds = max(MIN_ROUNDS, min(MAX_ROUNDS, rounds))
    best = dict(once)
    for r in range(rounds):
        for i in range(len(VARIANTS)):
            v = VARIANTS[(r + i) % len(VARIANTS)]
            best[v] = min(best[v], timed(w, v))
    report = ipd.audit(w.model, w.x)
    return Result(w.name, rounds, count_ops(w), len(report.findings), best, saved_mib(w), count_hooked(w))


def table(results: list[Result]) -> str:
    lines = [
        "| workload | plain (ms) | anomaly mode | anomaly, check_nan=False | watch (deep) | watch (fast, the default) "
        "| fast, a watch per step | inplace-doctor audit | µs added per op | watch, check_contents | saved MiB | µs per saved MiB |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in results:
        lines.append(
            f"| {r.name} | {r.best['plain'] * 1e3:.1f} | x{r.ratio('anomaly'):.2f} | x{r.ratio('anomaly-cheap'):.2f}"
            f" | x{r.ratio('watch'):.2f} | x{r.ratio('fast'):.2f} | x{r.ratio('fast-per-step'):.2f}"
            f" | x{r.ratio('audit'):.2f} | {r.us_per_op():.1f} | x{r.ratio('contents'):.2f} | {r.saved_mib:.1f}"
            f" | {r.us_per_saved_mib():.0f} |"
        )
    return "\n".join(lines)


def details(results: list[Result]) -> str:
    lines = []
    for r in results:
        ms = ", ".join(f"{v} {r.best[v] * 1e3:.1f}" for v in VARIANTS)
        h = r.hooked
        lines.append(
            f"- {r.name}: {r.rounds} rounds, {r.ops} aten ops, {r.saved_mib:.1f} MiB saved, {r.findings} findings;"
            f" min ms: {ms}"
        )
        lines.append(
            f"  fast: {h.saves} saved tensors, {h.module_calls} module calls, {h.nodes} autograd nodes per step;"
            f" {r.us_per_module_call():.1f} µs per module call, {r.us_per_saved_tensor():.1f} µs per saved tensor;"
            f" fast / cheap anomaly mode {r.best['fast'] / r.best['anomaly-cheap']:.2f},"
            f" audit / fast-per-step {r.best['audit'] / r.best['fast-per-step']:.2f};"
            f" a watch's entry and exit {(r.best['fast-per-step'] - r.best['fast']) * 1e6:.0f} µs"
        )
    return "\n".join(lines)


# What enters Python per event in the fast tracer: the per-call µs `--profile fast` prints.
_FAST_HOOKS = (
    (FastSavedTensors.pack, "pack (per saved tensor)"),
    (SavedTensors.unpack, "unpack (per saved tensor read by backward)"),
    (FastWrites.on_node, "node-creation hook (per autograd node)"),
    (ModulePaths._pre, "module pre-hook (per module call)"),
    (ModulePaths._post, "module post-hook (per module call)"),
)


def profile(variant: str, iterations: int, top: int) -> None:
    """cProfile of `watch` (deep) or the fast tracer on the MLP workload: top functions by tottime,
    and for the fast tracer the per-call µs of its hooks (inflated by the profiler: compare them
    with each other and across changes, not with the timings above)."""
    w = mlp()
    gc.collect()
    gc.freeze()
    for _ in range(3):
        timed(w, variant)
    profiler = cProfile.Profile()
    for _ in range(iterations):
        w.model.zero_grad(set_to_none=True)
        profiler.enable()
        run(w, variant)
        profiler.disable()
    print(f"\ncProfile of `{variant}` on {w.name}, {iterations} iterations, top {top} by tottime:\n")
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(top)
    if variant != "fast":
        return
    print("the fast tracer's hooks, cProfile µs per call (own time / with callees):")
    table = stats.stats  # type: ignore[attr-defined]  # (file, line, name) -> (calls, primitive, tottime, cumtime, callers)
    for function, label in _FAST_HOOKS:
        code = function.__code__
        key = (code.co_filename, code.co_firstlineno, code.co_name)
        calls, _, tottime, cumtime, _ = table.get(key, (0, 0, 0.0, 0.0, None))
        per_step = calls / iterations
        own = tottime / calls * 1e6 if calls else 0.0
        whole = cumtime / calls * 1e6 if calls else 0.0
        print(f"  {label}: {per_step:.0f} calls per step, {own:.2f} / {whole:.2f} µs")


# -- memory -------------------------------------------------------------------


def _rss_now() -> int:
    with open("/proc/self/statm") as statm:  # Linux: pages resident now
        return int(statm.read().split()[1]) * resource.getpagesize()


def peak_rss_child(variant: str, steps: int) -> None:
    """In a fresh process: `steps` steps of `variant` on ResNet-50; prints the RSS before the first
    step (model built; for `fast` the kernels registered, as the timing rounds hold them) and the
    peak RSS after the last, in bytes."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    w = resnet50()
    if variant == "fast":
        WriteKernels(lambda op, written: None).__enter__()  # held until the process exits
    before = _rss_now()
    for _ in range(steps):
        w.model.zero_grad(set_to_none=True)
        run(w, variant)
    print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # KiB on Linux


def memory(steps: int) -> None:
    print(f"\npeak RSS after {steps} steps of ResNet-50 (batch 4, 160 px), each variant in a fresh process;")
    print("'by the steps': the peak less the RSS before the first step (imports, model and the fast")
    print("tracer's kernel registration are in that RSS):\n")
    before, peak = {}, {}
    for variant in MEMORY_VARIANTS:
        out = subprocess.run(
            [sys.executable, __file__, "--memory-child", variant, "--steps", str(steps)],
            check=True, capture_output=True, text=True,
        ).stdout
        before[variant], peak[variant] = map(int, out.split()[-2:])
    print("| variant | RSS before (bytes) | peak RSS (bytes) | peak / plain | by the steps (bytes) | / plain |")
    print("|---|--:|--:|--:|--:|--:|")
    for v in MEMORY_VARIANTS:
        added, plain_added = peak[v] - before[v], peak["plain"] - before["plain"]
        print(
            f"| {v} | {before[v]} | {peak[v]} | x{peak[v] / peak['plain']:.4f} | {added} | x{added / plain_added:.4f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, help="timed rounds per workload (default: sized to the time budget)")
    parser.add_argument("--quick", action="store_true", help="smaller time budget and warm-up; noisier")
    parser.add_argument(
        "--profile", nargs="?", const="watch", choices=("watch", "fast"),
        help="also cProfile `watch` (default) or the fast tracer (`fast`) on the MLP workload",
    )
    parser.add_argument("--memory", action="store_true", help="only measure peak RSS per variant on ResNet-50")
    parser.add_argument("--steps", type=int, default=3, help="steps per process for --memory (default 3)")
    parser.add_argument("--memory-child", choices=MEMORY_VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        peak_rss_child(args.memory_child, args.steps)
        return
    if args.memory:
        memory(args.steps)
        return

    torch.set_num_threads(1)
    torch.manual_seed(0)
    budget = QUICK_BUDGET_S if args.quick else BUDGET_S
    warmup = 1 if args.quick else 2

    print(f"torch {torch.__version__}, inplace-doctor {ipd.__version__}, threads {torch.get_num_threads()}, CPU time")
    started, started_cpu = time.perf_counter(), time.process_time()
    registering = time.perf_counter()
    held = WriteKernels(lambda op, written: None).__enter__()  # the fast tracer's kernels, registered once
    print(f"registering the fast tracer's {registered()} kernels: {(time.perf_counter() - registering) * 1e3:.0f} ms wall")
    results = []
    for build in WORKLOADS:
        w = build()
        print(f"measuring {w.name} ...", flush=True)
        results.append(measure(w, args.rounds, budget, warmup))
    print(f"\n{details(results)}\n\n{table(results)}\n")
    wall, cpu = time.perf_counter() - started, time.process_time() - started_cpu
    print(f"(measured in {wall:.0f} s wall, {cpu:.0f} s CPU)")
    if args.profile:
        profile(args.profile, iterations=100, top=15)
    held.__exit__(None, None, None)


if __name__ == "__main__":
    main()
