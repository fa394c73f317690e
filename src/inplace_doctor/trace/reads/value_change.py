"""How much an in-place call changes its tensor: measured before the write, without a copy where possible (IPD105).

`largest_change` reads the tensor with one reduction for the common in-place
calls (ReLU and its clamps, `add_`/`sub_`); `positional_change` compares
element by element where NaN or inf make the reduction meaningless.
"""

from __future__ import annotations

from typing import Any

import torch


def _arg(args: Any, kwargs: Any, index: int, name: str, default: Any) -> Any:
    return args[index] if len(args) > index else kwargs.get(name, default)


def largest_change(func: Any, args: Any, kwargs: Any) -> float | None:
    """The largest change an in-place call is about to make, from a read-only reduction
    (no copy of the tensor), for the common ops; None when it needs a snapshot.

    NaN/inf count by position: an element that holds the same non-finite value before and
    after is unchanged, and the change is the largest over elements finite before and after;
    inf when an element turns non-finite or stops being so (or inf changes sign). Only when the
    reduction itself comes out NaN or inf is the change worked out element by element."""
    x = args[0]
    if not x.is_floating_point() or x.numel() == 0:
        return None
    name = getattr(func, "__name__", "")
    if name == "relu":
        smallest = float(x.min())
        if not finite(smallest):
            return positional_change(x.double(), torch.relu)
        return max(0.0, -smallest)
    if name in ("hardtanh", "relu6"):
        low, high = (0.0, 6.0) if name == "relu6" else (_arg(args, kwargs, 1, "min_val", -1.0), _arg(args, kwargs, 2, "max_val", 1.0))
        smallest, biggest = (float(v) for v in torch.aminmax(x))
        if not finite(smallest + biggest):  # NaN or inf in x
            return positional_change(x.double(), lambda d: torch.nn.functional.hardtanh(d, float(low), float(high)))
        return max(0.0, float(low) - smallest, biggest - float(high))
    if name == "leaky_relu":
        slope = float(_arg(args, kwargs, 1, "negative_slope", 0.01))
        smallest = float(x.min())
        if not finite(smallest):
            return positional_change(x.double(), lambda d: torch.nn.functional.leaky_relu(d, slope))
        return abs(1.0 - slope) * max(0.0, -smallest)
    if name in ("add_", "sub_", "__iadd__", "__isub__"):
        other = _arg(args, kwargs, 1, "other", None)
        alpha = abs(float(kwargs.get("alpha", 1.0)))
        if isinstance(other, torch.Tensor) and other.is_floating_point():
            change = alpha * float(other.detach().abs().max()) if other.numel() else 0.0
        elif isinstance(other, (int, float)):
            change = alpha * abs(float(other))
        else:
            return None
        if not finite(change):
            op = torch.sub if name in ("sub_", "__isub__") else torch.add
            operand = other.detach().double() if isinstance(other, torch.Tensor) else other
            return positional_change(x.double(), lambda d: op(d, operand, alpha=kwargs.get("alpha", 1)))
        return change
    return None


def finite(value: float) -> bool:
    return value - value == 0.0  # False for NaN and +-inf (inf - inf is NaN)


def positional_change(before: torch.Tensor, op: Any) -> float:
    """The largest change `op` makes to `before` (in double, like the reductions' arithmetic),
    over the elements finite before and after; inf when an element is non-finite on one side only
    or holds different non-finite values (NaN vs inf, -inf vs inf). The same NaN/inf in the same
    place is no change."""
    after = op(before)
    finite_before, finite_after = torch.isfinite(before), torch.isfinite(after)
    both_nan = torch.isnan(before) & torch.isnan(after)
    same_inf = torch.isinf(before) & (before == after)
    unchanged_nonfinite = both_nan | same_inf
    if bool((~(finite_before & finite_after) & ~unchanged_nonfinite).any()):
        return float("inf")
    finite = finite_before & finite_after
    if not bool(finite.any()):
        return 0.0
    return float((after[finite] - before[finite]).abs().max())


__all__ = ["finite", "largest_change", "positional_change"]
