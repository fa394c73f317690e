"""The `Ledger`: a `TorchDispatchMode` that counts every live storage's bytes, sampled after every op.

It registers every storage an op returns, counts its bytes until the storage
is freed (a weakref callback on the storage, which PyTorch keeps alive exactly
as long as its memory), and samples the live total after every op. This is the
accounting model of `torch.distributed._tools.mem_tracker.MemTracker`: the same
storages, counted at the same moments, so the two peaks agree to the byte
(tested).

The breakdown at a peak is taken lazily: when the total reaches a new maximum
the ledger only remembers that; the breakdown is computed at the first free
that follows (or at the end of the phase), when the set of live storages is
still exactly the one at the peak. `breakdown` turns it into categories and
holdings. On CUDA the bytes are rounded up to the caching allocator's 512-byte
blocks, as MemTracker does.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from ..._compat import TorchDispatchMode, current_autograd_node
from ...sites import module_path as _module_path
from ...trace.places.stacks import make_site
from ...trace.raised.blame import call_through
from ...trace.saves.saved_place import SavedPlace
from ...trace.tracer import Tracer
from ..training import StepPhase
from .result import Category, Holding

_CUDA_BLOCK = 512

# Ops PyTorch dispatches for its own bookkeeping, not the user's computation: the profiler's
# `record_function` markers (every `optimizer.step()` opens one) and asserts that return nothing.
# They allocate no storage; naming a peak after one would tell the user nothing.
_BOOKKEEPING_NAMESPACES = frozenset({"profiler"})
_BOOKKEEPING_PREFIXES = ("_record_function", "_profiler")
_BOOKKEEPING_OPS = frozenset({
    "_assert_async", "_assert_scalar", "_assert_tensor_metadata", "_functional_assert_async",
    "_functional_assert_scalar", "sym_constrain_range", "sym_constrain_range_for_size",
})


def is_bookkeeping_op(namespace: str, name: str) -> bool:
    """Whether an op (namespace `profiler`, name `_record_function_enter_new`) is PyTorch's
    internal bookkeeping rather than a computation the user's program asked for."""
    return namespace in _BOOKKEEPING_NAMESPACES or name.startswith(_BOOKKEEPING_PREFIXES) or name in _BOOKKEEPING_OPS


#: who allocated a tensor: the running module's path (relative to the model, "" the model itself)
#: in forward, or the autograd node in backward; (None, None) outside both
Owner = tuple[str | None, str | None]


def _owner_label(owner: Owner) -> str | None:
    """The owner as reports name it (`model.fc1`, `AddmmBackward0`)."""
    return _module_path(owner[0]) if owner[0] is not None else owner[1]


class Entry:
    """One live storage."""

    __slots__ = ("nbytes", "device", "ptr", "category", "op", "owner", "phase")

    def __init__(self, nbytes: int, device: str, ptr: int, op: str, owner: Owner, phase: StepPhase) -> None:
        self.nbytes = nbytes
        self.device = device
        self.ptr = ptr
        self.category: Category | None = None  # fixed categories; None: saved activation or temporary
        self.op = op
        self.owner = owner  # module path (forward) or autograd node (backward) that allocated it
        self.phase = phase


Row = tuple[Entry, "Category | None", Any]  # (entry, category, where autograd saved it, or None)


class Ledger(TorchDispatchMode):
    """Live storages, their bytes and categories, sampled after every op."""

    def __init__(self, tracer: Tracer | None) -> None:
        super().__init__()
        self.tracer = tracer
        self._entries: dict[int, tuple[weakref.ref[Any], Entry]] = {}  # id(storage) -> (ref, entry)
        self._ref_ids: dict[weakref.ref[Any], int] = {}
        self._on_free = self._free
        self.live = 0
        self.phase = StepPhase.SETUP
        self.ops = 0
        self.timeline: list[tuple[int, str, str, int]] = []
        self.step_peak = 0
        self.overall_peak = 0
        # phase -> [bytes, op index, op, where, snapshot or None]
        self.peaks: dict[str, list[Any]] = {}
        self._pending: list[str] = []

    # -- registration ------------------------------------------------------
    def _storage(self, t: torch.Tensor) -> Any:
        try:
            if t.is_meta or t.is_sparse:
                return None
            return t.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):
            return None

    def track(self, t: torch.Tensor, category: Category | None, op: str = "", owner: Owner = (None, None)) -> None:
        st = self._storage(t)
        if st is None:
            return
        known = self._entries.get(id(st))
        if known is not None and known[0]() is st:
            entry = known[1]
            nbytes = self._nbytes(st, entry.device)
            if nbytes != entry.nbytes:  # resized (`out=` ops, resize_)
                self.live += nbytes - entry.nbytes
                entry.nbytes = nbytes
            if category is not None:
                entry.category = category
            return
        device = str(t.device)
        nbytes = self._nbytes(st, device)
        entry = Entry(nbytes, device, st.data_ptr(), op, owner, self.phase)
        entry.category = category
        ref = weakref.ref(st, self._on_free)
        self._entries[id(st)] = (ref, entry)
        self._ref_ids[ref] = id(st)
        self.live += nbytes

    @staticmethod
    def _nbytes(st: Any, device: str) -> int:
        n = int(st.nbytes())
        if device.startswith("cuda"):
            return -(-n // _CUDA_BLOCK) * _CUDA_BLOCK
        return n

    def _free(self, ref: weakref.ref[Any]) -> None:
        key = self._ref_ids.pop(ref, None)
        if key is None:
            return
        if self._pending:
            self._take_pending()
        _, entry = self._entries.pop(key)
        self.live -= entry.nbytes

    def release(self) -> None:
        """Forget every storage (the run is over): no callbacks into a dead ledger."""
        self._entries.clear()
        self._ref_ids.clear()

    # -- the op stream -----------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = call_through(func, args, kwargs or {})
        name = func.__name__ if hasattr(func, "__name__") else str(func)
        name = str(name).split(".")[0]
        owner = self._owner()
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.track(t, None, name, owner)
        if is_bookkeeping_op(str(getattr(func, "namespace", "")), name):
            # Not an op of the user's step: no index, no timeline row, no peak named after it.
            # The totals still see it, so the overall peak stays MemTracker's to the byte.
            self.step_peak = max(self.step_peak, self.live)
            self.overall_peak = max(self.overall_peak, self.live)
            return out
        self.ops += 1
        self.timeline.append((self.ops, self.phase, name, self.live))
        if self.live > self.step_peak:
            self.step_peak = self.live
        if self.live > self.overall_peak:
            self.overall_peak = self.live
        state = self.peaks.get(self.phase)
        if state is None or self.live > state[0]:
            self.peaks[self.phase] = [self.live, self.ops, name, _owner_label(owner), None]
            if self.phase not in self._pending:
                self._pending.append(self.phase)
        return out

    def _owner(self) -> Owner:
        """(module path, autograd node) that runs now: the node in backward, the module in forward."""
        node = current_autograd_node()
        if node is not None:
            return None, str(node.name())
        if self.tracer is not None:
            ctx = self.tracer.modules.current
            if ctx is not None:
                return ctx[0], None
        return None, None

    # -- breakdowns --------------------------------------------------------
    def _take_pending(self) -> None:
        snapshot = self.snapshot()
        for phase in self._pending:
            self.peaks[phase][4] = snapshot
        self._pending = []

    def end_phase(self) -> None:
        if self._pending:
            self._take_pending()

    def snapshot(self) -> list[Row]:
        """(entry, category, where the oldest saved tensor on it was saved, or None) of every live storage, now."""
        tracer = self.tracer
        rows = []
        # Every entry still counted: this runs inside the free callback of the
        # first storage released after the peak, whose weakref is already dead.
        for _, entry in self._entries.values():
            place = None
            if entry.category is None and tracer is not None:
                records = tracer.saved_records(entry.ptr)
                if records:
                    place = records[0].place()  # not the record: it holds the tensor
            rows.append((entry, entry.category, place))
        return rows

    def new_step(self) -> None:
        self.ops = 0
        self.step_peak = self.live
        self.peaks = {}
        self._pending = []
        self.timeline = []


def breakdown(rows: list[Row]) -> tuple[dict[str, int], list[Holding]]:
    """Bytes by category, and the holdings (groups of storages held for one reason), largest first."""
    by_category: dict[str, int] = dict.fromkeys(Category, 0)
    groups: dict[tuple[Any, ...], list[int]] = {}
    located = SavedPlace.resolve_all([place for _, _, place in rows if place is not None])
    for entry, category, place in rows:
        key: tuple[Any, ...]
        if category is not None:
            cat, key = category, (category, "", None, None, None)
        elif place is not None:
            cat = Category.SAVED
            node = place.node or "<unnamed node>"
            label = f"{node}.{place.field}" if place.field else node
            frames, api, _ = located[id(place.stack)]
            module = place.module
            site = make_site(place.op or "", frames, api, module, "backward" if place.in_backward else "forward")
            key = (cat, label, module[0] if module is not None else None, None, site.location if site.file else None)
        else:
            cat = Category.TEMPORARIES
            verb = "output" if entry.phase != StepPhase.BACKWARD else "result"
            key = (cat, f"{entry.op} {verb}" if entry.op else "", entry.owner[0], entry.owner[1], None)
        by_category[cat] += entry.nbytes
        acc = groups.setdefault(key, [0, 0])
        acc[0] += entry.nbytes
        acc[1] += 1
    holdings = [
        Holding(category=k[0], nbytes=v[0], tensors=v[1], label=k[1], module=k[2], node=k[3], location=k[4])
        for k, v in groups.items()
    ]
    holdings.sort(key=lambda h: (-h.nbytes, h.category, h.label, h.where))
    return by_category, holdings
