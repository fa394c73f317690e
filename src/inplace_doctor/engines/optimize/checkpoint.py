"""Activation checkpointing, measured: would wrapping the largest holder of saved activations lower the peak?

`saved_by_module` adds up the saved activations at the end of forward per module subtree;
`checkpoint_suggestion` picks the candidate, wraps it in `torch.utils.checkpoint` on a copy,
measures and times that copy, and either returns a `CheckpointSuggestion` or sets
`plan.checkpoint_declined` to one line that says why not.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

import torch

from ...printing import fmt_bytes
from ..memory import MemoryReport, measure_owned, times_owned
from ..preserve import RngState
from ..training import LossFn, copy_for_training
from .plan import CheckpointSuggestion, Plan

# Checkpointing is suggested only where it lowers the peak by at least this share of it. Below
# that the saving is noise next to what parameters, gradients and optimizer state hold (resnet18
# at 2x3x64x64: layer1's 112 KiB of 136 MiB, 0.08%), while the recompute costs step time and
# brings caveats (BatchNorm statistics updated twice, IPD108).
CHECKPOINT_MIN_SHARE = 0.05


def saved_by_module(report: MemoryReport) -> list[tuple[str, int]]:
    """Saved-activation bytes at the forward peak per module subtree, largest first (root excluded)."""
    totals: dict[str, int] = {}
    for module, nbytes in report.saved_by_module("forward" if "forward" in report.peaks else None):
        parts = module.split(".") if module else []  # the root's own saves belong to no subtree
        for i in range(1, len(parts) + 1):
            key = ".".join(parts[:i])
            totals[key] = totals.get(key, 0) + nbytes
    return sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))


def _checkpoint_candidate(saved_by_module: list[tuple[str, int]]) -> tuple[str, int]:
    """The largest holder of saved activations that holds at most half of them.

    Checkpointing a module frees its activations between forward and its
    backward, but recomputes them all at once there: wrapping a module that
    holds nearly everything (`features`, the whole encoder) moves the peak
    instead of lowering it. Half leaves the rest of the network's activations
    to be freed while this one recomputes.
    """
    top_level = sum(n for name, n in saved_by_module if "." not in name)
    for name, n in saved_by_module:
        if n * 2 <= top_level:
            return name, n
    return saved_by_module[0]


def _runs_in_place(model: torch.nn.Module, path: str, flags: Mapping[str, bool]) -> bool:
    try:
        module = model.get_submodule(path)
    except AttributeError:
        return False
    return bool(flags.get(path, getattr(module, "inplace", False) is True))


def checkpoint_suggestion(
    model: torch.nn.Module,
    flags: Mapping[str, bool],
    plan: Plan,
    args: Any,
    kwargs: Any,
    loss_fn: LossFn | None,
    optimizer: Any,
    steps: int,
    rng: RngState,
    min_share: float,
) -> CheckpointSuggestion | None:
    """Measure checkpointing the best candidate under the planned `flags`; None (with
    `plan.checkpoint_declined` or a note saying why) when it is not worth suggesting."""
    import torch.utils.checkpoint as cp

    # A module that writes its own input in place cannot be checkpointed (the recompute writes
    # the saved input again, and backward raises), and would free nothing if it could.
    holders = [(n, b) for n, b in plan.saved_by_module if not _runs_in_place(model, n, flags)]
    peak = plan.peak_planned
    threshold = f"suggested from {min_share:.0%} of the peak"
    declined = "no single module holds enough saved activations for checkpointing to lower the peak meaningfully"
    if not holders:
        plan.checkpoint_declined = f"{declined} (no module that runs out of place holds any at the end of forward)"
        return None
    name, saved = _checkpoint_candidate(holders)
    # Checkpointing frees at most what the module holds: below the threshold it is not worth measuring.
    if saved < min_share * peak or saved == 0:
        plan.checkpoint_declined = (
            f"{declined} (the best candidate, {name}, holds {fmt_bytes(saved)}, "
            f"{_share(saved, peak)} of the {fmt_bytes(peak)} peak; {threshold})"
        )
        return None
    # Measured and timed on this one copy: a deep copy of it would copy the function below as
    # it is, still calling this copy's module.
    wrapped, opt = copy_for_training(model, optimizer, flags=flags)
    target = wrapped.get_submodule(name)
    forward = target.forward

    def checkpointed(*a: Any, **k: Any) -> Any:
        return cp.checkpoint(forward, *a, use_reentrant=False, **k)

    target.forward = checkpointed  # type: ignore[method-assign]
    rng.restore()
    try:
        after = measure_owned(wrapped, opt, args, kwargs, loss_fn=loss_fn, steps=steps, target=model)
    except Exception as e:  # a module that cannot be checkpointed (non-tensor outputs, ...)
        plan.notes.append(textwrap.shorten(f"checkpointing {name} could not be measured: {type(e).__name__}: {e}", 400, placeholder=" ..."))
        return None
    rng.restore()
    (t_after,) = times_owned([(wrapped, opt)], args, kwargs, loss_fn=loss_fn)
    lowered = peak - after.peak
    if min_share > 0 and lowered < min_share * peak:
        if lowered > 0:
            effect = f"lowers the {fmt_bytes(peak)} peak by only {fmt_bytes(lowered)}, {_share(lowered, peak)}"
        elif lowered == 0:
            effect = f"leaves the {fmt_bytes(peak)} peak unchanged"
        else:
            effect = f"raises the {fmt_bytes(peak)} peak to {fmt_bytes(after.peak)}"
        plan.checkpoint_declined = (
            f"{declined} (measured: checkpointing {name}, which holds {fmt_bytes(saved)}, {effect}; {threshold})"
        )
        return None
    caveats = []
    if model.training and any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in target.modules()):
        caveats.append("contains BatchNorm: its running statistics update again on recompute (IPD108)")
    return CheckpointSuggestion(
        module=name,
        saved_bytes=saved,
        peak_before=plan.peak_planned,
        peak_after=after.peak,
        time_ratio=t_after / plan.time_planned if plan.time_planned > 0 else float("nan"),
        caveats=caveats,
    )


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole > 0 else "n/a"
