"""Checkpoint recompute checked: does a non-reentrant region's recompute produce its forward's values?

PyTorch checks the recompute's shapes, dtypes and devices only. Here each op a
region runs in its forward leaves a fingerprint of its outputs (an exact
integer sum of their bit patterns: no tensor is kept); the recompute's ops are
paired with the forward's by order, per region and backward, and the first
whose fingerprint differs is reported with what the tracer knows of why: a
random op, or a tensor it reads from outside the region written since.

Only ops inside a region pay: while the tracer runs, checkpoint's two hook
classes count the regions open (`RegionCount`); with none open an op pays one
attribute read. Inside, the top saved-tensor hooks (about 1 µs to ask) name
the region and tell its forward from its recompute.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from .. import _compat
from ..events import CheckpointRecomputeDiffers, Event, WriteInfo
from .modules import ModulePaths
from .ops import op_name, writes_bytes
from .stacks import MAX_STACK, capture_stack, checkpoint_split, make_site, resolve_stack
from .storage import storage_key

# Ops whose output holds uninitialised memory: their values mean nothing until an op fills them.
_UNINITIALISED = frozenset(
    {"aten.empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty", "aten.new_empty_strided",
     "aten.empty_permuted"}
)
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

_kinds: dict[Any, tuple[bool, bool, bool]] = {}


def _kind(func: Any) -> tuple[bool, bool, bool]:
    """(counted: not a view, fingerprinted: its output is initialised, random: it takes a generator)."""
    known = _kinds.get(func)
    if known is None:
        schema = func._schema
        view = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
        random = any("Generator" in str(a.type) for a in schema.arguments)
        known = _kinds[func] = (not view, op_name(func) not in _UNINITIALISED, random)
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


class RegionCount:
    """How many non-reentrant checkpoint hooks are open (any thread): checkpoint's hook classes count
    their `with` blocks while at least one tracer runs. Undone when the last one leaves."""

    n = 0
    _users = 0
    _saved: list[tuple[type, Any, Any]] = []

    def __enter__(self) -> "RegionCount":
        cls = type(self)
        cls._users += 1
        if cls._users == 1:
            for hook_class in _compat.CHECKPOINT_HOOK_CLASSES:
                cls._saved.append((hook_class, hook_class.__dict__.get("__enter__"), hook_class.__dict__.get("__exit__")))
                _count_blocks(hook_class)
        return self

    def __exit__(self, *exc: object) -> None:
        cls = type(self)
        cls._users -= 1
        if cls._users == 0:
            for hook_class, enter, exit_ in cls._saved:
                for name, original in (("__enter__", enter), ("__exit__", exit_)):
                    if original is None:
                        delattr(hook_class, name)
                    else:
                        setattr(hook_class, name, original)
            cls._saved = []
            cls.n = 0


def _count_blocks(hook_class: type) -> None:
    enter, exit_ = hook_class.__enter__, hook_class.__exit__  # type: ignore[attr-defined]

    def __enter__(self: Any) -> Any:
        out = enter(self)
        RegionCount.n += 1
        self._inplace_doctor_counted = True
        return out

    def __exit__(self: Any, *exc: object) -> Any:
        if self.__dict__.pop("_inplace_doctor_counted", False):
            RegionCount.n = max(0, RegionCount.n - 1)
        return exit_(self, *exc)

    hook_class.__enter__ = __enter__  # type: ignore[attr-defined]
    hook_class.__exit__ = __exit__  # type: ignore[attr-defined]


class _Region:
    """What one region's forward ran: per op (op, output fingerprints, outside inputs, write serial)."""

    __slots__ = ("ops", "produced", "rng_preserved", "next_op", "outside", "called_from", "__weakref__")

    def __init__(self, rng_preserved: bool | None, called_from: Any) -> None:
        self.called_from = called_from  # a stack capture at its first op: the lines that called checkpoint
        self.ops: list[tuple[Any, tuple[tuple[int, ...] | None, ...] | None, tuple[tuple[int, int], ...], int]] = []
        self.produced: set[int] = set()  # storages the region's out-of-place ops allocated
        self.rng_preserved = rng_preserved
        self.next_op: dict[Any, int] = {}  # graph task -> index of the next recomputed op; -1: stopped
        self.outside: set[int] = set()  # storages read from outside the region (watched for writes)


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

    def after_op(self, region: tuple[Any, Any], func: Any, args: Any, kwargs: Any, out: Any, written: Any) -> None:
        """An op ran inside a region (its forward when `region[1]` is None, else its recompute)."""
        counted, initialised, random = _kind(func)
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
            record.produced.update(storage_key(t) for t in outs)
        record.ops.append((func, fingerprints, tuple(outside), self._serial))

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
