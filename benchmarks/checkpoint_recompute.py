"""What does checking checkpoint recomputes (IPD111) cost?

    python benchmarks/checkpoint_recompute.py            # ~2 min on 2 cores
    python benchmarks/checkpoint_recompute.py --rounds 5

Variants, each one forward + backward with `loss = output.sum()`, timed in interleaved rounds
(CPU time, one thread, minimum per variant), as benchmarks/overhead.py does:

- plain:      no instrumentation;
- watch-off:  `inplace_doctor.watch(deep=True)` with the recompute check taken out of its dispatch
              mode (what the tracer did before IPD111: no look at the saved-tensor hooks per op);
- watch:      `inplace_doctor.watch(deep=True)` as shipped (the fast tracer's per-op work in
              regions: benchmarks/fast_checkpoint.py).

Workloads: an MLP without checkpointing (what the check costs outside regions: one look at
the top saved-tensor hooks per op), the same MLP checkpointed in segments, and a transformer
encoder with each layer checkpointed (non-reentrant). Prints measurements; asserts nothing.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from _checkpointed import MLP, best_times  # benchmarks/ is on sys.path when run as a script
from torch import nn
from torch.utils.checkpoint import checkpoint

import inplace_doctor as ipd


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(256, 4, 512, dropout=0.1, batch_first=True) for _ in range(4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False)
        return x


def _step(model: nn.Module, x: torch.Tensor) -> None:
    model(x).sum().backward()


def _variants(model: nn.Module, x: torch.Tensor) -> dict[str, Callable[[], None]]:
    def plain() -> None:
        _step(model, x)

    def watched(check: bool) -> Callable[[], None]:
        def run() -> None:
            session = ipd.watch(deep=True)  # the deep tracer's dispatch mode looks at the hooks at every op
            if not check:
                session.tracer._mode.recompute = None  # the tracer before IPD111
            with session:
                _step(model, x)

        return run

    return {"plain": plain, "watch-off": watched(False), "watch": watched(True)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    workloads = [
        ("MLP 30 x Linear(64, 64) + GELU, batch 16, no checkpoint", MLP(), torch.randn(16, 64, requires_grad=True), 30),
        ("same MLP, checkpoint_sequential in 5 segments", MLP(5), torch.randn(16, 64, requires_grad=True), 30),
        ("TransformerEncoderLayer 4 x 256, batch 8, seq 64, each checkpointed", Encoder(),
         torch.randn(8, 64, 256, requires_grad=True), 8),
    ]
    print("| workload | plain (ms) | watch, check off | watch, check on | on / off |")
    print("|---|--:|--:|--:|--:|")
    for name, model, x, rounds in workloads:
        rounds = args.rounds or rounds
        best = best_times(_variants(model, x), model, x, rounds)
        p = best["plain"]
        print(
            f"| {name} | {p * 1e3:.1f} | x{best['watch-off'] / p:.2f} | x{best['watch'] / p:.2f} "
            f"| x{best['watch'] / best['watch-off']:.3f} |"
        )


if __name__ == "__main__":
    main()
