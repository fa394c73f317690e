"""What does the fast tracer's per-op interception inside checkpoint regions (IPD108, IPD111) cost?

    python benchmarks/fast_checkpoint.py            # ~3 min on 2 cores
    python benchmarks/fast_checkpoint.py --rounds 5

Variants, each one forward + backward with `loss = output.sum()`, timed in interleaved rounds
(CPU time, one thread, minimum per variant; the write kernels registered once for the whole run),
as benchmarks/overhead.py does:

- plain:       no instrumentation;
- fast, before: `watch(deep=False)` selecting the rules the fast tracer served before
               (IPD101-IPD104, IPD107, IPD110): no op but writes enters Python anywhere;
- fast:        `watch(deep=False)` selecting every rule it serves now, IPD108 and IPD111 among
               them: every op inside checkpoint regions (forward and recompute) enters Python;
- deep:        `watch(deep=True)` with the same rules: every op enters Python.

Workloads: an MLP without checkpoint (what serving IPD108/IPD111 costs a program without
checkpoint: nothing per op), the same MLP checkpointed in segments, a timm ViT and a timm ResNet
with `set_grad_checkpointing()` (non-reentrant, timm's default). Prints measurements; asserts
nothing.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from _checkpointed import MLP, best_times  # benchmarks/ is on sys.path when run as a script
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.rules import FAST_MODE_RULES
from inplace_doctor.trace.fast.write_kernels import WriteKernels

BEFORE = ["IPD101", "IPD102", "IPD103", "IPD104", "IPD107", "IPD110"]


def _timm(name: str, **kwargs: object) -> nn.Module:
    import timm

    model = timm.create_model(name, pretrained=False, **kwargs)
    model.set_grad_checkpointing(True)
    return model.train()


def _variants(model: nn.Module, x: torch.Tensor) -> dict[str, Callable[[], None]]:
    def step() -> None:
        model(x).sum().backward()

    def watched(deep: bool, select: list[str]) -> Callable[[], None]:
        def run() -> None:
            session = ipd.watch(deep=deep, select=select)
            with session:
                step()
            assert session.deep is deep

        return run

    rules = sorted(FAST_MODE_RULES)
    return {
        "plain": step, "fast, before": watched(False, BEFORE), "fast": watched(False, rules),
        "deep": watched(True, rules),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    held = WriteKernels(lambda op, written: None).__enter__()  # registered once, as benchmarks/overhead.py does
    workloads = [
        ("MLP 30 x Linear(64, 64) + GELU, batch 16, no checkpoint", lambda: MLP(), (16, 64), 30),
        ("same MLP, checkpoint_sequential in 5 segments", lambda: MLP(5), (16, 64), 30),
        ("timm vit_tiny_patch16_224, 64 px, patch 8, grad checkpointing, batch 2",
         lambda: _timm("vit_tiny_patch16_224", img_size=64, patch_size=8, num_classes=10), (2, 3, 64, 64), 8),
        ("timm resnet18, 64 px, grad checkpointing, batch 2", lambda: _timm("resnet18", num_classes=10),
         (2, 3, 64, 64), 8),
    ]
    print("| workload | plain (ms) | fast, before | fast | deep | fast / deep |")
    print("|---|--:|--:|--:|--:|--:|")
    for name, build, shape, rounds in workloads:
        rounds = args.rounds or rounds
        model = build()
        x = torch.randn(*shape, requires_grad=True)
        best = best_times(_variants(model, x), model, x, rounds)
        p = best["plain"]
        print(
            f"| {name} | {p * 1e3:.1f} | x{best['fast, before'] / p:.2f} | x{best['fast'] / p:.2f} "
            f"| x{best['deep'] / p:.2f} | {best['fast'] / best['deep']:.2f} |",
            flush=True,
        )
    held.__exit__(None, None, None)


if __name__ == "__main__":
    main()
