"""Saved tensors: a record per tensor autograd saves, which node holds it, and when it is freed.

The tracer's `saved_tensors_hooks` pack each saved tensor into a `SavedRecord`
(and re-check its version at unpack: PyTorch's own check is off under the
hooks); autograd's node-creation hook names the node and field holding it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from ... import _compat
from ...errors import InplaceError, carry_tool_error
from ...events import Event, SavedBy, SavedInfo, SavedTensorFreed, SavedTensorReached, StaleSavedTensorUsed
from ..ops import op_name
from ..owner import Busy, Sink
from ..places import stacks as _stacks
from ..places.modules import ModuleContext, ModulePaths
from ..places.nodes import MadeAt, not_reached, record_creation, save_for_backward_frame, saved_attrs, saved_objects
from ..places.stacks import SAVE_STACK, RawFrame, make_site, resolve_stack
from ..raised.blame import the_programs_error
from ..raised.pytorch_errors import named_output, pytorch_stale_message
from .autograd_facts import saved_field_is_read
from .fingerprint import fingerprint
from .saved_place import SavedPlace
from .storage import storage_key, storage_span

# The site's op of a save no op or node names: a label for the report's site line, never read back.
_UNNAMED = {SavedBy.CHECKPOINT: "checkpoint", SavedBy.UNKNOWN: "<unknown op>"}

_detach = torch._C.TensorBase.detach
_DisableTorchDispatch = _compat.DisableTorchDispatch
_dispatch_modes = _compat.dispatch_mode_count
_current_node = _compat.current_autograd_node
_BackwardCFunction = torch.autograd.function.BackwardCFunction
_Tensor, _Parameter = torch.Tensor, torch.nn.Parameter
_COMPACT_AT = 4096  # weakrefs of records packed and not yet indexed, before the freed ones are dropped


class SavedRecord(MadeAt):
    """What our pack hook hands autograd for one saved tensor, and what the tracer knows about it.

    `tensor` is a detached alias (same storage and version counter, no
    grad_fn, so no reference cycle through the node that saved it). Shape,
    dtype, memory span and source location are read from it, or resolved,
    only when a write or a finding needs them: packing runs on every save.
    """

    __slots__ = (  # and MadeAt's: stack, module, op
        "tensor", "key", "in_backward", "version", "node", "field", "read", "used", "__weakref__",
        "overwritten", "fingerprint", "seen", "handout", "written_at", "grad", "bytes_before", "node_serial", "inner",
        "original", "output_nr", "view",
    )

    def __init__(
        self, tensor: torch.Tensor, key: int, stack: Any, module: ModuleContext | None, in_backward: bool, version: int,
        grad: bool,
    ) -> None:
        self.tensor = tensor
        self.key = key
        self.stack = stack  # a `capture_stack()` capture until `where()` resolves it
        self.module = module
        self.in_backward = in_backward
        self.version = version
        self.node: str | None = None
        self.node_serial = 0  # which node saved it (one number per node), once `node` is known
        self.field: str | None = None
        self.op: str | None = None
        self.read = True
        self.used = False
        self.overwritten = False  # a write changed it since it was saved (or last unpacked)
        # Content checks (`contents.py`): the bytes' fingerprint at save, as last seen, the hand-out
        # of its memory, the line found writing it. None unless its memory was handed out (or all are checked).
        self.fingerprint: Any = None
        self.seen: Any = None
        self.handout: Any = None
        self.written_at: Any = None
        #: the saved tensor required grad (a write through an alias that does not is `.data` or
        #: `.detach()`'s); and the bytes' fingerprint before the first such write, taken by
        #: `WriteRecorder.before_write_through_alias` so that unpack can tell a change from a restore
        self.grad = grad
        self.bytes_before: Any = None
        #: a custom Function's `ctx.save_for_backward(...)` line, below the `apply` call the stack ends at
        self.inner: RawFrame | None = None
        #: the tensor autograd was handed (weakly) and its output number then: the node PyTorch's
        #: stale-tensor message names is the one it is an output of at backward (`stale_error`)
        self.original: Any = None
        self.output_nr = 0
        self.view = False

    def span(self) -> tuple[int, int, int] | None:
        return storage_span(self.tensor)

    def where(self) -> tuple[tuple[RawFrame, ...], str | None, ModuleContext | None, str, bool]:
        """(user frames, torch api, module context, phase, inside a checkpoint region), resolved once."""
        if not isinstance(self.stack, tuple):
            self.stack = resolve_stack(self.stack, SAVE_STACK)
        frames, api, in_region = self.stack
        if self.inner is not None and frames[-1:] != (self.inner,):
            frames = (*frames, self.inner)
        return frames, api, self.module, "backward" if self.in_backward else "forward", in_region

    def place(self) -> SavedPlace:
        """What the record says about where the tensor was saved, without the tensor (to keep)."""
        return SavedPlace(self.node, self.field, self.op, self.module, self.in_backward, self.stack)

    def info(self) -> SavedInfo:
        frames, api, module, phase, in_region = self.where()
        # Unnamed, under checkpoint's own call: the region's inputs, which it saves to recompute from
        # (its `_NoopSaveInputs` node is never named); never "the output of" an op we did not see.
        saved_by = SavedBy.CHECKPOINT if api in ("checkpoint", "checkpoint_sequential") else SavedBy.UNKNOWN
        if self.op or self.node:
            saved_by = SavedBy.OP
        op = self.op or (self.node.removesuffix("Backward0") if self.node else _UNNAMED[saved_by])
        return SavedInfo(
            saved_by=saved_by,
            in_checkpoint=in_region,
            site=make_site(op, frames, api, module, phase),
            node=self.node,
            field=self.field,
            version=self.version,
            shape=tuple(self.tensor.shape),
            dtype=str(self.tensor.dtype).removeprefix("torch."),
            read_by_backward=self.read,
            key=self.key,
        )


class SavedTensors:
    """The records of the saved tensors autograd still holds, by storage; the hooks that keep them.

    `pack` and `unpack` are the saved-tensor hooks, `on_node` the node-creation
    hook (nodes are named lazily, by `flush_nodes`, before anything reads them;
    the fast tracer's `saved_fast.FastSavedTensors` names them at once).

    Packing runs on every save, so it only makes the record: `by_storage` indexes
    records by their memory when something reads it (a write, a finding), and a
    record autograd freed before then costs no Python at all when it dies.
    """

    def __init__(self, sink: Sink, emit: Callable[[Event], None], modules: ModulePaths, busy: Busy) -> None:
        self._sink = sink
        self._emit = emit
        self._modules = modules
        self._busy = busy
        self.saves = 0
        #: storage key -> {record key: weakref to the record}, for the records indexed so far
        self._by_storage: dict[int, dict[int, weakref.ref[SavedRecord]]] = {}
        self._ref_keys: dict[weakref.ref[SavedRecord], tuple[int, int]] = {}
        self._on_release = self._release  # one bound method for every weakref callback
        #: weakrefs (no callback) to the records packed since `by_storage` was last read
        self._unindexed: list[weakref.ref[SavedRecord]] = []
        self._compact_at = _COMPACT_AT
        #: (node, the op run before it was created), not yet named
        self.pending_nodes: list[tuple[Any, Any]] = []
        self._nodes_seen = 0  # nodes whose saved tensors were flushed: the records' `node_serial`
        #: the last op the dispatch mode ran: the op of the next node created
        self.last_op: Any = None
        # keys of saved tensors a write changed (-> whether by a version bump): backward reaching
        # them, or their release, settles it
        self._overwritten_keys: dict[int, bool] = {}
        #: those a backward that raised had not reached (`_stands`): their release after it says nothing
        self._stopped_above: set[int] = set()
        #: the fast tracer's (`saved_fast.py`): weakrefs to the records packed since the last
        #: node-creation hook, which names them; None where nodes are named lazily
        self._fresh: list[weakref.ref[SavedRecord]] | None = None
        #: `contents.ContentChecks` while the tracer checks saved tensors' bytes
        self.contents: Any = None
        #: told each error unpack raises with the findings it confirmed (a caught one is said so)
        self.on_raised: Callable[[BaseException, Any], None] | None = None

    def pack(self, t: torch.Tensor) -> SavedRecord:
        cls = type(t)
        if cls is _Tensor or cls is _Parameter:
            # `_detach`, not `t.detach()`: the fast tracer wraps that one to see the user's detaches
            if _dispatch_modes():
                with _DisableTorchDispatch():  # our own detach is not the user's op
                    alias = _detach(t)
            else:  # no mode to hide it from (the fast tracer's usual case): the guard costs a detach's time
                alias = _detach(t)
        else:  # a tensor subclass may need its own __torch_dispatch__ for detach
            with self._busy:
                alias = t.detach()
        key = self.saves = self.saves + 1
        stack = _stacks.capture()  # `capture_stack()`, inlined (one Python call less per save)
        record = SavedRecord(
            alias, key, stack, self._modules.current, _current_node() is not None, t._version, t.requires_grad,
        )
        record.original = weakref.ref(t)
        record.output_nr = t.output_nr
        record.view = t._is_view()
        ref = weakref.ref(record)
        fresh = self._fresh
        if fresh is not None:
            fresh.append(ref)
        unindexed = self._unindexed
        unindexed.append(ref)
        if len(unindexed) > self._compact_at:
            self._compact()
        contents = self.contents
        if contents is not None and (contents.check_all or contents.by_storage or contents.search is not None):
            ptr = storage_key(alias)
            if ptr:
                contents.on_pack(record, ptr)
        return record

    @property
    def by_storage(self) -> dict[int, dict[int, weakref.ref[SavedRecord]]]:
        """storage key -> {record key: weakref to the record} of the saved tensors autograd still holds."""
        if self._unindexed:
            self._index()
        return self._by_storage

    def _index(self) -> None:
        refs, self._unindexed = self._unindexed, []
        by_storage, ref_keys, on_release = self._by_storage, self._ref_keys, self._on_release
        for weak in refs:
            record = weak()
            if record is None:  # freed before anything asked: nothing to forget
                continue
            ptr = storage_key(record.tensor)
            if not ptr:
                continue
            ref = weakref.ref(record, on_release)
            ref_keys[ref] = (ptr, record.key)
            bucket = by_storage.get(ptr)
            if bucket is None:
                bucket = by_storage[ptr] = {}
            bucket[record.key] = ref

    def _compact(self) -> None:
        """Drop the freed records' weakrefs of a long run nothing asked about (no write, no finding)."""
        self._unindexed = [ref for ref in self._unindexed if ref() is not None]
        self._compact_at = max(_COMPACT_AT, 2 * len(self._unindexed))
        if self._fresh:  # packs without a node hook after them, for long
            self._fresh = [ref for ref in self._fresh if ref() is not None]

    def _release(self, ref: weakref.ref[SavedRecord]) -> None:
        """Autograd freed a saved tensor (backward ran, or the graph was dropped)."""
        ptr, key = self._ref_keys.pop(ref, (0, 0))
        bucket = self._by_storage.get(ptr)
        if bucket is not None:
            bucket.pop(key, None)
            if not bucket:
                del self._by_storage[ptr]
        if key in self._overwritten_keys:
            # Freed without backward reading it: whatever was predicted for it cannot happen ...
            self._overwritten_keys.pop(key, None)
            if key not in self._stopped_above:  # ... unless a backward that raised stopped before it
                self._sink(SavedTensorFreed(key))
            self._stopped_above.discard(key)

    def unpack(self, record: SavedRecord) -> torch.Tensor:
        t = record.tensor
        record.used = True
        if record.fingerprint is not None and self.contents is not None:
            self.contents.on_unpack(record, t)
        if record.overwritten:
            record.overwritten = False
            self._overwritten_keys.pop(record.key, None)
            if t._version == record.version:  # changed without a version bump: backward reads the new values
                if record.bytes_before is not None and fingerprint(t) == record.bytes_before:
                    self._emit(SavedTensorFreed(record.key))  # ... unless they are the saved ones, put back
                else:
                    self._emit(SavedTensorReached(record.key))
        version = t._version
        if version != record.version:
            if self.pending_nodes:  # which field holds it decides the node PyTorch's message names
                self.flush_nodes()
            node = _compat.current_autograd_node()
            node_name = node.name() if node is not None else record.node
            original = RuntimeError(pytorch_stale_message(t, named_output(record, node), version, record.version))
            the_programs_error(original)  # PyTorch's own check, which the hooks switched off: not the tool's crash
            stopped, whole = not_reached(node, self._stands)
            self._stopped_above |= stopped
            error = self._sink(StaleSavedTensorUsed(record.info(), node_name, version, stopped if whole else None))
            # The traceback keeps this frame alive (autograd may hold the error
            # for a while): it must not keep the saved tensor alive too.
            del t, record
            if isinstance(error, InplaceError):  # the program sees PyTorch's error; a watch it leaves raises ours from it
                carry_tool_error(original, error)
                if self.on_raised is not None:
                    self.on_raised(original, error.findings)
            raise original
        return t

    def mark_overwritten(self, record: SavedRecord, by_version: bool) -> None:
        """A write changed `record`'s tensor (`by_version`: bumped the version it shares): backward
        reaching it, or its release, settles what follows."""
        record.overwritten = True
        self._overwritten_keys[record.key] = by_version

    def _stands(self, held: Any) -> bool:
        """A record whose prediction still stands: changed, by a version bump not undone since
        (FSDP2 puts its refills' versions back), or without one."""
        by_version = self._overwritten_keys.get(held.key) if type(held) is SavedRecord else None
        return by_version is not None and (not by_version or held.tensor._version != held.version)

    def predicted(self, key: int) -> None:
        """Something was predicted for saved tensor `key`: its release without backward says it cannot happen."""
        self._overwritten_keys[key] = False

    def is_predicted(self, key: int) -> bool:
        return key in self._overwritten_keys

    def settled(self, key: int) -> None:
        self._overwritten_keys.pop(key, None)

    def versions_on(self, storage_ptr: int) -> list[tuple[Any, int]]:
        """(weakref to the record, its tensor's version now) of each live record on one storage."""
        bucket = self.by_storage.get(storage_ptr)
        candidates = []
        if bucket:
            for ref in bucket.values():
                record = ref()
                if record is not None:
                    candidates.append((ref, record.tensor._version))
        return candidates

    def records(self, storage_ptr: int) -> list[SavedRecord]:
        """Records of the saved tensors autograd still holds on one storage, oldest first, named."""
        if self.pending_nodes:
            self.flush_nodes()
        bucket = self.by_storage.get(storage_ptr)
        if not bucket:
            return []
        return [r for _, ref in sorted(bucket.items()) if (r := ref()) is not None]

    @property
    def nodes_seen(self) -> int:
        """How many nodes with saved tensors were named: the `node_serial` of the latest."""
        return self._nodes_seen

    def live(self) -> int:
        return sum(len(b) for b in self.by_storage.values())

    # -- which node saved what --------------------------------------------
    def on_node(self, node: Any) -> None:
        self.pending_nodes.append((node, self.last_op))
        record_creation(node, self._modules.current, self.last_op)

    def flush_nodes(self) -> None:
        nodes, self.pending_nodes = self.pending_nodes, []
        for node, last_op in nodes:
            self.name_node(node, last_op)

    def name_node(self, node: Any, last_op: Any, node_name: str | None = None) -> bool:
        """Name the records `node` holds: the node and field holding each, and the op that saved it
        (`last_op`, the op that made the node). Whether it holds any (autograd runs the
        node-creation hook right after the node's saves: they are all there)."""
        attrs = saved_attrs(node)
        if not attrs:
            return False
        self._nodes_seen += 1
        serial = self._nodes_seen
        op = None
        custom = False
        inner: RawFrame | None = None
        found = False
        for where, saved in saved_objects(node):
            record = saved.data
            if type(record) is not SavedRecord or record.node is not None:
                continue
            if not found:
                found = True
                if node_name is None:
                    node_name = node.name()
                custom = isinstance(node, _BackwardCFunction)
                if custom:
                    op = f"{node_name.removesuffix('Backward')}.apply"
                    inner = save_for_backward_frame(node)
                elif last_op is not None:
                    op = op_name(last_op)
            if custom:  # what the user's backward reads: ctx.saved_tensors
                where = "saved_tensors" + where[where.index("["):] if "[" in where else "saved_tensors"
                record.inner = inner
            record.node = node_name
            record.node_serial = serial
            record.field = where
            record.op = op
            record.read = saved_field_is_read(node, node_name, where)  # type: ignore[arg-type]
        return found


class NodeCreationHook:
    """autograd's node-creation hook, installed while the tracer runs."""

    def __init__(self, hook: Callable[[Any], None]) -> None:
        self.hook = hook

    def __enter__(self) -> NodeCreationHook:
        _compat.push_node_creation_hook(self.hook)
        return self

    def __exit__(self, *exc: object) -> None:
        _compat.pop_node_creation_hook()
