"""Checkpoint recompute checked: does a non-reentrant region's recompute produce its forward's values?

PyTorch checks the recompute's shapes, dtypes and devices only. Here each op a
region runs in its forward leaves a fingerprint of its outputs (an exact
integer sum of their bit patterns: no tensor is kept); the recompute's ops are
paired with the forward's by order, per region and backward, and the first
whose fingerprint differs is reported with what the tracer knows of why: a
random op, or a tensor it reads from outside the region written since.

Only ops inside a region pay: while the tracer runs, checkpoint's two hook
classes count the regions open (`checkpoint_blocks.RegionCount`); with none
open an op pays one attribute read. Inside, the top saved-tensor hooks (about 1 µs to ask) name
the region and tell its forward from its recompute.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from ... import _compat
from ...events import CheckpointRecomputeDiffers, CheckpointSavedBeforeWrite, Event, WriteInfo
from ..ops import op_name, writes_bytes
from ..places.modules import ModulePaths
from ..places.stacks import MAX_STACK, capture_stack, checkpoint_split, make_site, resolve_stack
from ..saves.storage import storage_key
from .checkpoint_blocks import RegionCount
from .saved_writes import SAVED_THEN_WRITTEN, SavedWrite, recomputed_saves, sample, saved_argument, written_argument

# Ops whose output holds uninitialised memory: their values mean nothing until an op fills them.
_UNINITIALISED = frozenset(
    {"aten.empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty", "aten.new_empty_strided",
     "aten.empty_permuted"}
)
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# Random ops whose schema takes no Generator: they draw from the device's default one. Dropout on
# CUDA in training is the fused `native_dropout` (on CPU, `bernoulli_`, which takes a Generator).
_RANDOM_WITHOUT_GENERATOR = frozenset({"aten.native_dropout"})

_kinds: dict[Any, tuple[bool, bool, bool, str | None]] = {}


def _kind(func: Any) -> tuple[bool, bool, bool, str | None]:
    """(counted: not a view, fingerprinted: its output is initialised, random: it takes a generator,
    the argument it saves and then writes: `saved_writes.SAVED_THEN_WRITTEN`)."""
    known = _kinds.get(func)
    if known is None:
        schema = func._schema
        view = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
        name = op_name(func)
        random = any("Generator" in str(a.type) for a in schema.arguments) or name in _RANDOM_WITHOUT_GENERATOR
        known = _kinds[func] = (not view, name not in _UNINITIALISED, random, SAVED_THEN_WRITTEN.get(name))
    return known


def fingerprint(t: torch.Tensor) -> tuple[int, ...] | None:
    """An exact fingerprint of a tensor's values, in their logical order: sums of its elements' bit
    patterns as int64, unweighted, and weighted by position linearly and quadratically (two cumulative
    sums), so that a permutation (another dropout mask with as many zeros) changes it too.

    Integer addition is associative, so the sums do not depend on how a reduction is split over
    threads; None for what it cannot read plainly.
    """
    if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
        return None
    if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
        return None
    if t.numel() == 0:
        return (0, 0, 0)
    with _compat.DisableTorchDispatch(), torch.no_grad():
        if t.is_complex():
            t = torch.view_as_real(t)
        bits = t if not t.is_floating_point() and t.dtype != torch.bool else t.view(_INT_OF_SIZE[t.element_size()])
        once = bits.reshape(-1).cumsum(0, dtype=torch.int64)
        sums = torch.stack((once[-1], once.sum(), once.cumsum(0).sum()))
        return tuple(sums.tolist())


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [item for item in value if isinstance(item, torch.Tensor)]
    return []


def _inputs(args: Any, kwargs: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for value in (*args, *kwargs.values()):
        out.extend(_tensors(value))
    return out


class _Region:
    """What one region's forward ran: per op (op, output fingerprints, outside inputs, write serial)."""

    __slots__ = (
        "ops", "produced", "rng_preserved", "next_op", "outside", "called_from", "saved_writes", "rebuilt", "__weakref__"
    )

    def __init__(self, rng_preserved: bool | None, called_from: Any) -> None:
        self.called_from = called_from  # a stack capture at its first op: the lines that called checkpoint
        self.ops: list[tuple[Any, tuple[tuple[int, ...] | None, ...] | None, tuple[tuple[int, int], ...], int]] = []
        #: storages the region's out-of-place ops allocated -> (the op's index, which output)
        self.produced: dict[int, tuple[int, int]] = {}
        self.rng_preserved = rng_preserved
        self.next_op: dict[Any, int] = {}  # graph task -> index of the next recomputed op; -1: stopped
        self.outside: set[int] = set()  # storages read from outside the region (watched for writes)
        self.saved_writes: list[SavedWrite] = []  # ops that wrote an argument they saved (`saved_writes.py`)
        #: graph task -> {index of an op that made a `saved_writes` argument: the storage its recompute made}
        self.rebuilt: dict[Any, dict[int, int]] = {}


class _Watched:
    """A storage some live region read from outside: the last write to it, kept cheap until needed."""

    __slots__ = ("regions", "serial", "write")

    def __init__(self) -> None:
        self.regions = 0
        self.serial = 0
        self.write: tuple[Any, ...] | None = None


class RecomputeCheck:
    """Fingerprints a region's forward ops and compares its recompute's with them; emits the first difference."""

    def __init__(self, emit: Callable[[Event], None], modules: ModulePaths) -> None:
        self._emit = emit
        self._modules = modules
        self._regions: weakref.WeakKeyDictionary[Any, _Region] = weakref.WeakKeyDictionary()
        #: storage -> the last write to it, for storages live regions read from outside
        self.watched: dict[int, _Watched] = {}
        self._serial = 0
        self.compared = 0  # recomputed ops compared with their forward's
        #: (op, fingerprint before its kernel) of an op that saves and then writes an argument
        self._before: tuple[Any, Any] | None = None

    def after_op(self, region: tuple[Any, Any], func: Any, args: Any, kwargs: Any, out: Any, written: Any) -> None:
        """An op ran inside a region (its forward when `region[1]` is None, else its recompute)."""
        counted, initialised, random, _ = _kind(func)
        if not counted:
            return
        frame, task = region
        if task is None:
            self._forward_op(frame, func, args, kwargs, out, written, initialised)
        else:
            self._recomputed_op(frame, task, func, args, kwargs, out, initialised, random)

    def _forward_op(
        self, frame: Any, func: Any, args: Any, kwargs: Any, out: Any, written: Any, initialised: bool
    ) -> None:
        record = self._regions.get(frame)
        if record is None:
            record = self._regions[frame] = _Region(_compat.checkpoint_preserves_rng(frame), capture_stack())
            weakref.finalize(frame, self._unwatch, record.outside)
        outside = []
        for t in _inputs(args, kwargs):
            key = storage_key(t)
            if key and key not in record.produced:
                outside.append((key, t._version))
                if key not in record.outside:
                    record.outside.add(key)
                    self.watched.setdefault(key, _Watched()).regions += 1
        outs = _tensors(out)
        fingerprints: tuple[tuple[int, ...] | None, ...] | None = tuple(fingerprint(t) for t in outs) if initialised else None
        if written:
            if any(storage_key(t) not in record.produced for t in written):
                fingerprints = None  # a write to state outside the region: IPD108's side effect, not a value
        else:
            record.produced.update((storage_key(t), (len(record.ops), slot)) for slot, t in enumerate(outs))
        if self._before is not None:
            self._saved_write(record, frame, func, args, kwargs)
        record.ops.append((func, fingerprints, tuple(outside), self._serial))

    # -- ops that write an argument they saved (`saved_writes.py`) --------------
    def before_write(self, region: tuple[Any, Any], func: Any, args: Any, kwargs: Any) -> None:
        """An op that writes runs in a region: for the class, fingerprint the argument before its kernel."""
        argument = _kind(func)[3]
        if argument is None or region[1] is not None:
            return
        t = written_argument(func, argument, args, kwargs)
        self._before = (func, fingerprint(t)) if t is not None else None

    def _saved_write(self, record: _Region, frame: Any, func: Any, args: Any, kwargs: Any) -> None:
        before_func, before = self._before  # type: ignore[misc]
        self._before = None
        argument = _kind(func)[3]
        t = written_argument(func, argument, args, kwargs) if argument is not None else None
        if before_func is not func or t is None:
            return
        written = fingerprint(t)
        if written is None or written == before:
            return  # the kernel left it as saved (eval mode): backward reads the same either way
        key = storage_key(t)
        frame_holders = getattr(frame, "weak_holders", None)
        record.saved_writes.append(
            SavedWrite(
                index=len(record.ops),
                saves=len(frame_holders) if frame_holders is not None else -1,
                argument=argument,  # type: ignore[arg-type]
                producer=record.produced.get(key),
                outside=key if key not in record.produced else None,
                written=written,
                sample=sample(t),
                shape=tuple(t.shape),
                dtype=str(t.dtype).removeprefix("torch."),
                stack=capture_stack(),
                module=self._modules.current,
            )
        )
        RegionCount.listeners.add(self)

    def recompute_ended(self, frame: Any, task: Any) -> None:
        """A region's recompute ended (ran to the end or stopped early): did it skip a write it saved?"""
        record = self._regions.get(frame)
        if record is None or not record.saved_writes:
            return
        reached = record.next_op.get(task, 0)
        rebuilt = record.rebuilt.pop(task, {})
        for write in record.saved_writes:
            if reached < 0 or reached > write.index or write.saves < 0:
                continue  # the recompute ran the op (or pairing ended): its kernel wrote the argument again
            key = rebuilt.get(write.producer[0]) if write.producer is not None else write.outside
            saved = saved_argument(recomputed_saves(frame, task, write.saves), key)
            if saved is None or fingerprint(saved) == write.written:
                continue
            self._emit_saved_write(record, write, saved)

    def _emit_saved_write(self, record: _Region, write: SavedWrite, saved: torch.Tensor) -> None:
        inner, api, outer = checkpoint_split(write.stack, MAX_STACK)
        frames = (outer + inner)[-MAX_STACK:]
        op = op_name(record.ops[write.index][0])
        self._emit(
            CheckpointSavedBeforeWrite(
                site=make_site(op, frames, api, write.module, "forward"),
                checkpoint_call=make_site("checkpoint", outer, None, None, "forward") if outer else None,
                position=write.index + 1,
                argument=write.argument,
                shape=write.shape,
                dtype=write.dtype,
                written=write.sample,
                saved=sample(saved),
                uninitialised=write.producer is not None
                and op_name(record.ops[write.producer[0]][0]) in _UNINITIALISED,
                outside=write.outside is not None,
            )
        )

    def _recomputed_op(
        self, frame: Any, task: Any, func: Any, args: Any, kwargs: Any, out: Any, initialised: bool, random: bool
    ) -> None:
        record = self._regions.get(frame)
        if record is None:
            return  # its forward ran before the tracer started
        index = record.next_op.get(task, 0)
        if index < 0:
            return
        if index >= len(record.ops) or record.ops[index][0] is not func:
            record.next_op[task] = -1  # a different path: pairing by order ends here
            return
        record.next_op[task] = index + 1
        if record.saved_writes:
            for write in record.saved_writes:
                if write.producer is not None and write.producer[0] == index:
                    outs = _tensors(out)
                    if write.producer[1] < len(outs):
                        record.rebuilt.setdefault(task, {})[index] = storage_key(outs[write.producer[1]])
        _, expected, outside, serial = record.ops[index]
        if expected is None or not initialised:
            return
        self.compared += 1
        if tuple(fingerprint(t) for t in _tensors(out)) == expected:
            return
        record.next_op[task] = -1  # the first difference is the one to name
        now = {storage_key(t): t._version for t in _inputs(args, kwargs)}
        changed = [key for key, version in outside if key in now and now[key] != version]
        # The line inside the region, as the recompute runs it, under the lines that called checkpoint in forward.
        inner, api, _ = checkpoint_split(capture_stack(), MAX_STACK)
        outer = checkpoint_split(record.called_from, MAX_STACK)[2]
        frames = (outer + inner)[-MAX_STACK:]
        self._emit(
            CheckpointRecomputeDiffers(
                site=make_site(op_name(func), frames, api, self._modules.current, "forward"),
                position=index + 1,
                random=random,
                rng_preserved=record.rng_preserved,
                changed_by=self._write_after(outside, serial),
                input_version_changed=bool(changed),
                nondeterministic_kernels=any(t.device.type != "cpu" for t in _tensors(out))
                and not torch.are_deterministic_algorithms_enabled(),
            )
        )

    # -- writes to what regions read from outside ----------------------------
    def note_write(self, func: Any, t: torch.Tensor, key: int) -> None:
        """A write to a watched storage (called by the write recorder); its site is resolved only if reported."""
        entry = self.watched[key]
        self._serial += 1
        entry.serial = self._serial
        phase = "backward" if _compat.current_autograd_node() is not None else "forward"
        entry.write = (func, capture_stack(), self._modules.current, phase, tuple(t.shape), t.dtype, weakref.ref(t))

    def _write_after(self, outside: tuple[tuple[int, int], ...], serial: int) -> WriteInfo | None:
        for key, _ in outside:
            entry = self.watched.get(key)
            if entry is not None and entry.write is not None and entry.serial > serial:
                func, stack, module, phase, shape, dtype, ref = entry.write
                frames, api, in_region = resolve_stack(stack, MAX_STACK)
                tensor = ref()
                return WriteInfo(
                    site=make_site(op_name(func), frames, api, module, phase),
                    shape=shape,
                    dtype=str(dtype).removeprefix("torch."),
                    writes_bytes=writes_bytes(func),
                    in_checkpoint=in_region,
                    target=self._modules.state_name(tensor) if tensor is not None else None,
                )
        return None

    def _unwatch(self, keys: set[int]) -> None:
        for key in keys:
            entry = self.watched.get(key)
            if entry is not None:
                entry.regions -= 1
                if entry.regions <= 0:
                    del self.watched[key]

    def clear(self) -> None:
        self._regions = weakref.WeakKeyDictionary()
        self.watched = {}
        self._before = None
        RegionCount.listeners.discard(self)
