"""What benchmarks/checkpoint_recompute.py and benchmarks/fast_checkpoint.py share: the MLP they
checkpoint in segments and their timing (interleaved rounds, CPU time, minimum per variant)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential


class MLP(nn.Module):
    """30 x Linear(64, 64) + GELU; with `segments`, run through `checkpoint_sequential` (non-reentrant)."""

    def __init__(self, segments: int = 0) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(30) for m in (nn.Linear(64, 64), nn.GELU())])
        self.segments = segments

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.segments:
            return checkpoint_sequential(self.layers, self.segments, x, use_reentrant=False)
        return self.layers(x)


def best_times(
    variants: dict[str, Callable[[], None]], model: nn.Module, x: torch.Tensor, rounds: int
) -> dict[str, float]:
    """Each variant's fastest round (seconds of CPU time) after one warm-up run of each; the order
    rotates from round to round, gradients cleared and garbage collected before each run."""
    for run in variants.values():  # warm-up
        run()
    best = {k: float("inf") for k in variants}
    order = list(variants)
    for r in range(rounds):
        for k in order[r % len(order):] + order[: r % len(order)]:
            model.zero_grad(set_to_none=True)
            x.grad = None
            gc.collect()
            start = time.process_time()
            variants[k]()
            best[k] = min(best[k], time.process_time() - start)
    return best
