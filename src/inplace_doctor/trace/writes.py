"""Writes: what each op wrote, and which saved tensors, caller inputs and held aliases it hit.

A write to a storage where saved tensors live is *pending* until the next op
(or the end of the user-level call, or `flush`): by then its version bump has
happened, and `settle` tells a write that changed a saved tensor from one
that merely shares its memory.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from .. import _compat
from ..events import (
    CallerInputWritten,
    Event,
    HeldTensorOverwritten,
    SavedTensorOverwritten,
    SideEffectRepeated,
    WriteInfo,
)
from .checkpoint.recompute import RecomputeCheck
from .checkpoint.saved_writes import WRITES_ITS_OWN_SAVE
from .ops import op_name, writes_bytes
from .owner import Busy
from .places.modules import ModulePaths
from .places.stacks import MAX_STACK, capture_stack, in_framework_state_sync, make_site, resolve_stack
from .reads.aliases import HeldTensors
from .reads.caller_reads import CallerReads
from .saves.fingerprint import fingerprint
from .saves.saved import SavedRecord, SavedTensors
from .saves.storage import elements_overlap, storage_key, storage_span


class PendingWrite:
    """A write to the storage of saved tensors: (weakref to the record, its version before) candidates."""

    __slots__ = ("info", "span", "candidates", "written", "written_version", "own_save")

    def __init__(
        self, info: WriteInfo, span: tuple[int, int, int], candidates: list[tuple[Any, int]], written: torch.Tensor,
        own_save: str | None = None,
    ) -> None:
        self.info = info
        #: the field under which the writing op's own node saved what it writes (`saved_writes.py`)
        self.own_save = own_save
        self.span = span
        self.candidates = candidates
        self.written = weakref.ref(written)
        self.written_version = written._version

    def bumped(self) -> bool:
        t = self.written()
        return t is None or t._version != self.written_version


class WriteRecorder:
    """Records each write the dispatch mode sees and reports what it overwrote.

    Args:
        before_write: called with each tensor an op is about to write.
        track_call_inputs: treat the arguments of each top-level module call
            as the caller's inputs (`on_top_level_call`).
    """

    def __init__(
        self,
        emit: Callable[[Event], None],
        modules: ModulePaths,
        saved: SavedTensors,
        held: HeldTensors,
        busy: Busy,
        before_write: Callable[[torch.Tensor], None] | None,
        track_call_inputs: bool,
        recompute: RecomputeCheck | None = None,
    ) -> None:
        self._emit = emit
        self._recompute = recompute
        self._modules = modules
        self._saved = saved
        self._held = held
        self._busy = busy
        self.before_write = before_write
        self._track_call_inputs = track_call_inputs
        self.writes = 0
        self.pending: list[PendingWrite] = []
        # storage key -> (label, span, the caller's tensor): the arguments of the running outermost call
        self._inputs: dict[int, tuple[str, tuple[int, int, int], weakref.ref[torch.Tensor]]] = {}
        self._inputs_anywhere = False  # writes outside any module count too (`set_caller_inputs`)
        #: writes a module's own `inplace=True` made into the caller's tensors: reported at a later read
        self.caller_reads = CallerReads(emit, modules)
        #: whether a call with an `inplace=True` argument (`F.relu(x, inplace=True)`) is running now
        self.in_flag_call: Callable[[], bool] = lambda: False
        # storage -> weakref to the non-grad tensor forward wrote there (IPD108)
        self._forward_state: dict[int, weakref.ref[torch.Tensor]] = {}

    def call_before_write(self, written: list[torch.Tensor]) -> None:
        assert self.before_write is not None
        with self._busy:
            for t in written:
                self.before_write(t)

    def before_write_through_alias(self, func: Any, written: list[torch.Tensor]) -> None:
        """Before `func` writes `written`: for each saved tensor that required grad on the memory of
        one that does not (a `.data` or `.detach()` alias; a write through `.data` is one autograd's
        version check cannot see), fingerprint the bytes as saved, once. Unpack then tells a change
        (IPD104, confirmed) from the same bytes put back before backward (Lookahead and SAM's
        evaluate-then-restore of `p.data`), which computes nothing wrong."""
        if _frameworks_own(func):
            return  # not recorded either: nothing to compare
        by_storage = self._saved.by_storage
        for t in written:
            if t.requires_grad:
                continue
            span = storage_span(t)
            bucket = by_storage.get(span[0]) if span is not None else None
            if not bucket:
                continue
            for ref in list(bucket.values()):
                record = ref()
                if record is not None and record.grad and record.bytes_before is None and not record.overwritten:
                    with self._busy:
                        record.bytes_before = fingerprint(record.tensor)

    def record(self, func: Any, written: list[torch.Tensor], values_unchanged: bool = False) -> None:
        """`values_unchanged`: the op copied a tensor onto its own memory (`load_state_dict` loading a
        `state_dict()` alias back): the version still moves, but no held alias now holds other values."""
        self.writes += 1
        if _frameworks_own(func):
            return
        for t in written:
            self._record_written_tensor(func, t, values_unchanged)

    def _record_written_tensor(self, func: Any, t: torch.Tensor, values_unchanged: bool = False) -> None:
        span = storage_span(t)
        if span is None:
            return
        if self._recompute is not None and self._recompute.watched and span[0] in self._recompute.watched:
            self._recompute.note_write(func, t, span[0])  # a checkpoint region read it: its recompute may differ
        node = _compat.current_autograd_node()
        if node is None:
            if not t.requires_grad:  # state (counters, running sums), not activations
                if len(self._forward_state) > 4096:
                    self._forward_state = {k: ref for k, ref in self._forward_state.items() if ref() is not None}
                self._forward_state[span[0]] = weakref.ref(t)
        elif span[0] in self._forward_state and node.name() != "torch::autograd::AccumulateGrad":
            self._state_written_again(func, t, span)
        argument = self._caller_argument(span) if self._inputs else None
        held = []
        if self._held.by_storage and writes_bytes(func) and not values_unchanged:
            held = self._held.overwritten_by(span, t)
        candidates = self._saved.versions_on(span[0])
        if not candidates and argument is None and not held:
            return
        info = self._write_info(func, t)
        for entry in held:  # reported if the stale alias is used as a snapshot afterwards
            entry.stale = HeldTensorOverwritten(info, entry.label, entry.site)
        if argument is not None:
            self._caller_input_written(info, *argument)
        if candidates:
            self.pending.append(PendingWrite(info, span, candidates, t, WRITES_ITS_OWN_SAVE.get(op_name(func))))

    def _state_written_again(self, func: Any, t: torch.Tensor, span: tuple[int, int, int]) -> None:
        if self._forward_state.pop(span[0])() is None:  # that tensor died; its memory was reused
            return
        self._emit(SideEffectRepeated(self._write_info(func, t), "a tensor written in forward"))

    def batch_norm_in_backward(self, func: Any, args: Any, kwargs: Any) -> None:
        """A training-mode batch norm running during backward is a recompute: its running stats update again."""
        training = args[5] if len(args) > 5 else kwargs.get("training")
        running_mean = args[3] if len(args) > 3 else kwargs.get("running_mean")
        if training and running_mean is not None:
            self._emit(SideEffectRepeated(self._write_info(func, running_mean), "BatchNorm running statistics"))

    def describe(self, func: Any, t: torch.Tensor) -> WriteInfo:
        """The write of `t` by `func` running now, as events carry it (its stack captured here)."""
        return self._write_info(func, t)

    def _write_info(self, func: Any, t: torch.Tensor) -> WriteInfo:
        frames, api, in_region = resolve_stack(capture_stack(), MAX_STACK)  # one capture: lines and region
        phase = "backward" if _compat.current_autograd_node() is not None else "forward"
        name = op_name(func)
        module = self._modules.current
        origin = self._modules.current_origin(tuple({f[0] for f in frames})) if module and module[3] else None
        return WriteInfo(
            site=make_site(name, frames, api, module, phase, origin),
            shape=tuple(t.shape),
            dtype=str(t.dtype).removeprefix("torch."),
            writes_bytes=writes_bytes(func),
            in_checkpoint=in_region,
            target=self._modules.state_name(t),
        )

    # -- the caller's inputs ------------------------------------------------
    def set_caller_inputs(self, labelled: list[tuple[str, torch.Tensor]], anywhere: bool = False) -> None:
        """Tensors a caller handed to the model: writes to them inside a module are reported (with
        `anywhere`, outside any too)."""
        self._inputs_anywhere = anywhere
        self._inputs = {}
        for label, t in labelled:
            span = storage_span(t)
            if span is not None and span[0] not in self._inputs:
                self._inputs[span[0]] = (label, span, weakref.ref(t))

    def _caller_argument(
        self, span: tuple[int, int, int]
    ) -> tuple[str, tuple[int, int, int], weakref.ref[torch.Tensor]] | None:
        entry = self._inputs.get(span[0])
        if entry is None or (self._modules.current is None and not self._inputs_anywhere) or not _overlaps(span, entry[1]):
            return None
        # Keyed by address: a caller's tensor freed since (a checkpoint's recompute input, dropped while
        # its modules are still on the stack) may have left its address to another tensor's memory.
        tensor = entry[2]()
        if tensor is None or storage_key(tensor) != span[0]:
            return None
        return entry

    def _caller_input_written(
        self, info: WriteInfo, label: str, _span: object, ref: weakref.ref[torch.Tensor]
    ) -> None:
        """At once, unless an `inplace=True` (the running module's own flag, or the argument of the
        call running now) asked for the write and the caller's tensor is one `watch` saw passed in:
        then only if the caller reads it after the call."""
        tensor = ref()
        asked = info.site.module_inplace is True or self.in_flag_call()
        if self._track_call_inputs and asked and tensor is not None:
            self.caller_reads.asked(info, label, tensor)
        else:
            self._emit(CallerInputWritten(info, label))

    def on_top_level_call(self, module: torch.nn.Module, args: Any, kwargs: dict[str, Any] | None) -> None:
        if not self._track_call_inputs:
            return
        if args is None:  # the call returned: only a write it was asked for waits for the caller's read
            self._inputs = {}
            return
        self.caller_reads.call_started()
        name = type(module).__name__
        self.set_caller_inputs([(f"argument {i} of {name}", t) for i, t in _labelled(args, kwargs or {})])

    def on_top_level_returned(self, output: Any) -> None:
        """An outermost call returned `output`: its asked-for writes not returned wait for a read."""
        if self._track_call_inputs:
            self.caller_reads.call_returned(output)

    # -- what pending writes did -----------------------------------------
    def settle(self) -> None:
        """Decide what pending writes did, now that their version bumps happened."""
        writes, self.pending = self.pending, []
        if self._saved.pending_nodes:
            self._saved.flush_nodes()
        for write in writes:
            reported: set[tuple[Any, ...]] = set()  # one event per node a write hits (`a * a` saves a twice)
            for ref, version_before in write.candidates:
                record = ref()
                if record is None or _own_save(write, record, self._saved.nodes_seen):
                    continue
                version_now = record.tensor._version
                shares = version_now != version_before
                if shares and version_now == record.version:
                    continue
                touched = write.info.writes_bytes and _overlaps(write.span, record.span())
                touched = touched and self._same_elements(write, record)
                if not shares and not (touched and record.read):
                    continue
                frames = record.where()[0]
                # one node, not one line: an RNN loop's `h[0] @ w` saves h in a new node each step
                node_key = (record.node, record.node_serial, frames[-1:])
                if record.node is not None and node_key in reported:
                    continue
                reported.add(node_key)
                self._saved.mark_overwritten(record, shares)
                self._emit(
                    SavedTensorOverwritten(
                        write=write.info,
                        saved=record.info(),
                        version_now=version_now,
                        shares_version_counter=shares,
                        already_used_by_backward=record.used,
                        write_bumped_a_version=shares or write.bumped(),
                        saved_elements_written=touched,
                    )
                )

    def _same_elements(self, write: PendingWrite, record: SavedRecord) -> bool:
        """Whether the write touched elements the saved tensor covers (not just the same byte range:
        `unsafe_chunk` pieces of one gate tensor interleave, as in LSTMCell's composite kernel)."""
        written = write.written()
        if written is None:
            return True
        with self._busy:
            return elements_overlap(written, record.tensor)

    def clear(self) -> None:
        """Forget pending writes, the caller's inputs and forward's state writes (the run ended)."""
        self.pending.clear()
        self._inputs = {}
        self.caller_reads.clear()
        self._forward_state = {}


def _own_save(write: PendingWrite, record: SavedRecord, nodes_seen: int) -> bool:
    """The write is the kernel of the op whose node saved `record` just before it ran (`F.rrelu`'s
    noise): backward reads what the kernel wrote, which is what it needs. Not so for a node of an
    earlier call of the op on the same buffer (`node_serial` tells them apart)."""
    return write.own_save is not None and record.field == write.own_save and record.node_serial == nodes_seen


def _frameworks_own(func: Any) -> bool:
    """A write that is a framework's parameter management, not the user's: DDP's deliberate,
    version-preserving state sync, and FSDP2's `fsdp::` ops (`fsdp.split_with_sizes_copy` refills
    the unsharded parameters before backward with the values forward used, after freeing them with
    a storage resize no op shows; `fsdp.chunk_cat` fills gradient buffers). When the allocator gave
    the refilled storage the same address, the refill was taken for a `.data`-like write to the
    weights forward saved (IPD104 on a clean job). The fast tracer sees the aten ops inside those:
    their Python implementations are found on the stack."""
    return in_framework_state_sync() or getattr(func, "namespace", None) == "fsdp"


def _labelled(args: Any, kwargs: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """Top-level tensors of a call's arguments, by position, then by keyword (`model(**batch)`, as
    `Trainer` calls it, passes them all by keyword)."""
    by_position = [(str(i), t) for i, t in enumerate(args) if isinstance(t, torch.Tensor)]
    return by_position + [(name, t) for name, t in kwargs.items() if isinstance(t, torch.Tensor)]


def _overlaps(a: tuple[int, int, int], b: tuple[int, int, int] | None) -> bool:
    return b is not None and a[0] == b[0] and a[1] < b[2] and b[1] < a[2]
