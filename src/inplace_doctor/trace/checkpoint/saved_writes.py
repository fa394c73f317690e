"""Kernels that write an argument autograd saved before the kernel ran, checked under checkpoint.

The class: an ATen op whose schema marks an argument written (`Tensor(b!)`) that it does not
return, whose autograd node saves that argument as an input (before the kernel runs) and saves
nothing after the kernel. `rrelu_with_noise` (`F.rrelu(x, training=True)`, `nn.RReLU`) is the one
on torch 2.14.1: it saves `self` and `noise`, then its kernel draws the noise into `noise`.
Outside checkpoint the saved `noise` is the very buffer the kernel then fills: backward reads the
drawn values, nothing is wrong, and nothing is said.

Under non-reentrant `torch.utils.checkpoint` with early stop (the default) the recompute stops
as soon as it has saved as many tensors as the forward did. When such an op's input saves are
the region's last, the recompute stops before its kernel runs, and backward reads the argument
as it was before the write (for `F.rrelu`, an uninitialised `empty_like`): the gradient is
silently wrong while the forward is bit-exact. Here the forward's written values are
fingerprinted; when a recompute ends without running the op, the tensor it saved for that
argument (found by its storage) is fingerprinted too, and a difference is reported.

Ops of the class are named once, below (`tests/trace/test_saved_writes.py` scans every aten
schema and probes each candidate's saves); every other op pays nothing.
"""

from __future__ import annotations

from typing import Any

import torch

from ... import _compat
from ..saves.storage import storage_key

#: op name -> the written argument its node saves as an input, with no save after the kernel.
#: Other functional ops that write an argument, and why they are not here (probed by the test):
#: `_batch_norm_with_update` and `_native_batch_norm_legit` save their running statistics but
#: also their outputs (after the kernel: the recompute runs it); `rrelu_with_noise_` saves its
#: result; `_fused_moving_avg_obs_fq_helper` saves none of what it writes.
SAVED_THEN_WRITTEN: dict[str, str] = {"aten.rrelu_with_noise": "noise"}
#: op name -> the argument its kernel writes after its own node saved it: backward reads what the
#: kernel wrote, which is what it needs (no finding). The class above, and the in-place
#: `rrelu_with_noise_`, outside it only because it also saves its result after the kernel.
WRITES_ITS_OWN_SAVE: dict[str, str] = {**SAVED_THEN_WRITTEN, "aten.rrelu_with_noise_": "noise"}

SAMPLE = 3  # values of the written and of the saved tensor kept for the message


class SavedWrite:
    """One run, in a region's forward, of an op of the class that changed the argument it saved."""

    __slots__ = ("index", "saves", "argument", "producer", "outside", "written", "sample", "shape", "dtype", "stack", "module")

    def __init__(
        self, index: int, saves: int, argument: str, producer: tuple[int, int] | None, outside: int | None,
        written: Any, sample: tuple[float, ...], shape: tuple[int, ...], dtype: str, stack: Any, module: Any,
    ) -> None:
        self.index = index  # the op's place among the region's counted ops
        self.saves = saves  # the region's saves so far (its own input saves included)
        self.argument = argument
        self.producer = producer  # (index, output) of the region's op that made the argument's memory, or None
        self.outside = outside  # the argument's storage, when it comes from outside the region
        self.written = written  # `recompute.fingerprint` of what the kernel wrote
        self.sample = sample
        self.shape = shape
        self.dtype = dtype
        self.stack = stack
        self.module = module


def written_argument(func: Any, name: str, args: Any, kwargs: Any) -> torch.Tensor | None:
    """The argument `name` of an op call, by keyword or by its schema position."""
    if name in kwargs:
        value = kwargs[name]
    else:
        position = next(i for i, a in enumerate(func._schema.arguments) if a.name == name)
        value = args[position] if position < len(args) else None
    return value if isinstance(value, torch.Tensor) else None


def sample(t: torch.Tensor) -> tuple[float, ...]:
    """The first few values of a tensor, read without an op the tracer sees."""
    with _compat.DisableTorchDispatch(), torch.no_grad():
        flat = t.detach().reshape(-1)[:SAMPLE]
        return tuple(float(v) for v in flat.tolist()) if not flat.is_complex() else ()


def recomputed_saves(frame: Any, gid: Any, upto: int) -> list[torch.Tensor]:
    """The tensors a recompute saved for the region's first `upto` forward saves, last first (none
    where this torch's checkpoint frame keeps them otherwise: checked at import by `_compat` only
    for the hooks' closures, so read defensively here, in the user's backward)."""
    recomputed = getattr(frame, "recomputed", {}).get(gid)
    holders = getattr(frame, "weak_holders", None)
    if recomputed is None or not isinstance(holders, list):
        return []
    out = []
    for ref in reversed(holders[:upto]):
        holder = ref()
        handle = getattr(holder, "handles", {}).get(gid) if holder is not None else None
        if handle is not None and handle in recomputed:
            out.append(recomputed[handle])
    return out


def saved_argument(saves: list[torch.Tensor], key: int | None) -> torch.Tensor | None:
    """Of the recompute's saves, the one on storage `key` (the argument, as the recompute saved it)."""
    if key is None:
        return None
    return next((t for t in saves if storage_key(t) == key), None)
