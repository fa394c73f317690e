"""One instrumented run: every write, every saved tensor, and when it is released.

The tracer owns a private `TorchDispatchMode` (writes), `saved_tensors_hooks`
(saves, with its own version re-check at unpack), autograd's node-creation hook
(which node and field hold each saved tensor) and global module hooks (module
paths). It reports `events` to a sink and knows nothing about rules.

Known limitations:
- Writes that PyTorch makes without a dispatch-visible write or a version bump
  are invisible: BatchNorm's running-statistic update, writes through numpy,
  writes to inference tensors.
- Inside a non-reentrant `torch.utils.checkpoint` region the checkpoint's own
  saved-tensor hooks replace ours: saves there are rebuilt on recompute, and
  PyTorch does not check their versions either, so neither do we. Writes there
  to tensors saved outside the region are seen.
- Tensors saved before the tracer started are checked by PyTorch itself, not
  by the tracer; an error they raise is still recognised by its message.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, NamedTuple

import torch

from .. import _compat
from .autograd_facts import saved_field_is_read
from ..events import (
    CallerInputWritten,
    Event,
    HeldTensorOverwritten,
    InplaceErrorRaised,
    SavedInfo,
    SavedTensorFreed,
    SavedTensorOverwritten,
    SavedTensorReached,
    SideEffectRepeated,
    StaleSavedTensorUsed,
    WriteInfo,
)
from .aliases import HeldTensors
from .inplace_calls import InplaceCalls
from .modules import ModuleContext, ModuleTracker
from .origins import ConstructionRecorder
from .ops import _op_facts, _writes_bytes, _written, op_facts, op_name, restores_version_bump, write_spec
from ..sites import Site
from .stacks import MAX_STACK, SAVE_STACK, RawFrame, capture_stack, checkpoint_in_traceback, frames_from_traceback, in_ddp_state_sync, inplace_op_in_traceback, make_site, resolve_stack, resolve_stacks
from .storage import elements_overlap, storage_key, storage_span

Sink = Callable[[Event], "BaseException | None"]

class SavedPlace(NamedTuple):
    """Who saved a tensor and where (`_SavedRecord.place()`); `stack` is a capture or its resolution."""

    node: str | None
    field: str | None
    op: str | None
    module: ModuleContext | None
    in_backward: bool
    stack: Any

    @staticmethod
    def resolve_all(places: list["SavedPlace"]) -> dict[int, tuple[tuple[RawFrame, ...], str | None, bool]]:
        """id(place.stack) -> (user frames, torch api, inside a checkpoint region), in one batch."""
        todo = {id(p.stack): p.stack for p in places if not isinstance(p.stack, tuple)}
        resolved = dict(zip(todo, resolve_stacks(list(todo.values()), SAVE_STACK)))
        resolved.update((id(p.stack), p.stack) for p in places if isinstance(p.stack, tuple))
        return resolved


class _SavedRecord:
    """What our pack hook hands autograd for one saved tensor, and what the tracer knows about it.

    `tensor` is a detached alias (same storage and version counter, no
    grad_fn, so no reference cycle through the node that saved it). Shape,
    dtype, memory span and source location are read from it, or resolved,
    only when a write or a finding needs them: packing runs on every save.
    """

    __slots__ = (
        "tensor", "key", "stack", "module", "in_backward", "version", "node", "field", "op", "read", "used",
        "overwritten", "__weakref__",
    )

    def __init__(
        self, tensor: torch.Tensor, key: int, stack: Any, module: ModuleContext | None, in_backward: bool, version: int
    ) -> None:
        self.tensor = tensor
        self.key = key
        self.stack = stack  # a `capture_stack()` capture until `where()` resolves it
        self.module = module
        self.in_backward = in_backward
        self.version = version
        self.node: str | None = None
        self.field: str | None = None
        self.op: str | None = None
        self.read = True
        self.used = False
        self.overwritten = False  # a write changed it since it was saved (or last unpacked)

    def span(self) -> tuple[int, int, int] | None:
        return storage_span(self.tensor)

    def where(self) -> tuple[tuple[RawFrame, ...], str | None, ModuleContext | None, str, bool]:
        """(user frames, torch api, module context, phase, inside a checkpoint region), resolved once."""
        if not isinstance(self.stack, tuple):
            self.stack = resolve_stack(self.stack, SAVE_STACK)
        frames, api, in_region = self.stack
        return frames, api, self.module, "backward" if self.in_backward else "forward", in_region

    def place(self) -> SavedPlace:
        """What the record says about where the tensor was saved, without the tensor (to keep)."""
        return SavedPlace(self.node, self.field, self.op, self.module, self.in_backward, self.stack)

    def info(self) -> SavedInfo:
        op = self.op or (self.node.removesuffix("Backward0") if self.node else "<unknown op>")
        frames, api, module, phase, in_region = self.where()
        return SavedInfo(
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


class _PendingWrite:
    __slots__ = ("info", "span", "candidates", "written", "written_version")

    def __init__(
        self, info: WriteInfo, span: tuple[int, int, int], candidates: list[tuple[Any, int]], written: torch.Tensor
    ) -> None:
        self.info = info
        self.span = span
        self.candidates = candidates
        self.written = weakref.ref(written)
        self.written_version = written._version

    def bumped(self) -> bool:
        t = self.written()
        return t is None or t._version != self.written_version


class _DispatchMode(_compat.TorchDispatchMode):
    def __init__(self, tracer: "Tracer") -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        tracer = self.tracer
        if kwargs is None:
            kwargs = {}
        if tracer._busy:
            return func(*args, **kwargs)
        if tracer._pending_nodes:
            tracer._flush_nodes()
        if tracer._pending_writes:
            tracer._settle()
        tracer.ops += 1
        _, spec, batch_norm = _op_facts.get(id(func)) or op_facts(func)
        written = _written(spec, args, kwargs) if spec else None
        if written and tracer._before_write is not None:
            tracer._call_before_write(written)
        if tracer.inplace_calls.overwritten and _compat.current_autograd_node() is None:
            tracer.inplace_calls.check_reads(func, args, kwargs)  # before the op: the values it reads
        if tracer.held.stale_ids:
            tracer.held.check_uses(func, args, kwargs, written)
        try:
            out = func(*args, **kwargs)
        except BaseException as exc:
            # By id: holding the exception would hold its traceback's frames, the
            # graph, and through our hooks the tracer: a cycle gc cannot see.
            tracer._failed_op = (id(exc), func)
            raise
        tracer._last_op = func
        if batch_norm and _compat.current_autograd_node() is not None:
            tracer._batch_norm_in_backward(func, args, kwargs)
        if written:
            tracer._record_write(func, written)
            if restores_version_bump(func):
                torch.autograd.graph.increment_version([t for t in written if not t.is_inference()])
        return out


def _disable_dynamo_directly() -> None:
    """Wrap the dispatch mode in `torch._dynamo.disable` itself, once.

    torch wraps every mode's `__torch_dispatch__` in `torch._disable_dynamo`,
    so that a compiled function called while the mode is active never traces
    the mode. Its lazy-import layer is one more Python call per op: about 3 %
    of a small model's step. `torch._dynamo.disable` gives the same protection
    without it (torch's wrapper imports torch._dynamo at the first op anyway).
    """
    current = _DispatchMode.__dict__["__torch_dispatch__"]
    raw = getattr(current, "__wrapped__", None)
    if raw is None or getattr(current, "_torchdynamo_disable", False):
        return  # not wrapped by this torch, or done already
    try:
        import torch._dynamo
    except Exception:  # a platform without dynamo: keep torch's own wrapper
        return
    _DispatchMode.__torch_dispatch__ = torch._dynamo.disable(raw, recursive=True)  # type: ignore[method-assign]


class Tracer:
    """Context manager that records writes and saved tensors and reports events.

    Args:
        sink: receives each event; may return an exception for the tracer to
            raise at that point (fail-fast, or the stale-tensor error at unpack).
        fail_fast: also settle writes as soon as the user-level call returns.
        before_write: called with each tensor an op is about to write (audit
            uses it to snapshot the caller's parameters and inputs).
        track_call_inputs: treat the arguments of each top-level module call
            as the caller's inputs (audit names them itself instead).
        observe_reads: watch in-place calls and `state_dict()` holders (IPD105,
            IPD107). Off for memory measurement: measuring a change allocates.
    """

    def __init__(
        self,
        sink: Sink,
        *,
        fail_fast: bool = False,
        before_write: Callable[[torch.Tensor], None] | None = None,
        track_call_inputs: bool = True,
        observe_reads: bool = True,
    ) -> None:
        self._sink = sink
        self._observe_reads = observe_reads
        self._before_write = before_write
        self.ops = 0
        self._fail_fast = fail_fast
        self.modules = ModuleTracker()
        self._by_storage: dict[int, dict[int, weakref.ref[_SavedRecord]]] = {}
        self._ref_keys: dict[weakref.ref[_SavedRecord], tuple[int, int]] = {}
        self._on_release = self._release  # one bound method for every weakref callback
        self._pending_nodes: list[tuple[Any, Any]] = []
        self._pending_writes: list[_PendingWrite] = []
        # keys of saved tensors a write changed: backward reaching them, or their release, settles it
        self._overwritten_keys: set[int] = set()
        self._busy = False
        self._last_op: Any = None
        self._failed_op: tuple[int, Any] | None = None
        self._inputs: dict[int, tuple[str, tuple[int, int, int]]] = {}
        # storage -> weakref to the non-grad tensor forward wrote there (IPD108)
        self._forward_state: dict[int, weakref.ref[torch.Tensor]] = {}
        self._track_call_inputs = track_call_inputs
        self.modules.on_top_level = self._on_top_level_call
        self.inplace_calls = InplaceCalls(self)
        self.held = HeldTensors(self)
        self._error_module: tuple[int, ModuleContext | None] | None = None
        self._contexts: list[Any] = []
        self._active = False
        self.saves = 0
        self.writes = 0

    # -- lifecycle -------------------------------------------------------
    def __enter__(self) -> "Tracer":
        if self._active:
            raise RuntimeError("this Tracer is already active")
        self._active = True
        self.modules.__enter__()
        self._contexts = [self.modules]
        try:
            _compat.push_node_creation_hook(self._on_node)
            self._contexts.append(_NodeHookContext())
            hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            hooks.__enter__()
            self._contexts.append(hooks)
            _disable_dynamo_directly()
            mode = _DispatchMode(self)
            mode.__enter__()
            self._contexts.append(mode)
            construction = _SubclassConstruction(mode)
            construction.__enter__()
            self._contexts.append(construction)
            recorder = ConstructionRecorder()  # models built inside (a script under `run`): flag fixes' lines
            recorder.__enter__()
            self._contexts.append(recorder)
            # Also settles writes as the user-level call returns when fail_fast,
            # so the raise points at the line that overwrote.
            if self._observe_reads:
                self.inplace_calls.__enter__()
                self._contexts.append(self.inplace_calls)
                self.held.__enter__()
                self._contexts.append(self.held)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc and exc[0] is None:
                self.flush()
                for overwritten in self.held.unused_stale():  # held, overwritten, not used (yet)
                    self._sink(overwritten)
            elif exc and isinstance(exc[1], BaseException):
                self._error_module = (id(exc[1]), self.modules.current)
        finally:
            while self._contexts:
                ctx = self._contexts.pop()
                ctx.__exit__(None, None, None)
            self._pending_writes.clear()
            self._pending_nodes.clear()
            self._inputs = {}
            self._forward_state = {}
            self.inplace_calls.clear()
            self._active = False

    def flush(self) -> None:
        """Name pending saved tensors and settle pending writes now."""
        if self._pending_nodes:
            self._flush_nodes()
        if self._pending_writes:
            self._settle()

    # -- saved tensors ---------------------------------------------------
    def _pack(self, t: torch.Tensor) -> _SavedRecord:
        if type(t) is torch.Tensor or type(t) is torch.nn.Parameter:
            with _compat.DisableTorchDispatch():  # our own detach is not the user's op
                alias = t.detach()
        else:  # a tensor subclass may need its own __torch_dispatch__ for detach
            self._busy = True
            try:
                alias = t.detach()
            finally:
                self._busy = False
        key = self.saves = self.saves + 1
        in_backward = _compat.current_autograd_node() is not None
        record = _SavedRecord(alias, key, capture_stack(), self.modules.current, in_backward, t._version)
        ptr = storage_key(alias)
        if ptr:
            ref = weakref.ref(record, self._on_release)
            self._ref_keys[ref] = (ptr, key)
            bucket = self._by_storage.get(ptr)
            if bucket is None:
                bucket = self._by_storage[ptr] = {}
            bucket[key] = ref
        return record

    def _release(self, ref: "weakref.ref[_SavedRecord]") -> None:
        """Autograd freed a saved tensor (backward ran, or the graph was dropped)."""
        ptr, key = self._ref_keys.pop(ref, (0, 0))
        bucket = self._by_storage.get(ptr)
        if bucket is not None:
            bucket.pop(key, None)
            if not bucket:
                del self._by_storage[ptr]
        if key in self._overwritten_keys:
            # Freed without backward reading it: whatever was predicted for it cannot happen.
            self._overwritten_keys.discard(key)
            self._sink(SavedTensorFreed(key))

    def _unpack(self, record: _SavedRecord) -> torch.Tensor:
        t = record.tensor
        record.used = True
        if record.overwritten:
            record.overwritten = False
            self._overwritten_keys.discard(record.key)
            if t._version == record.version:  # changed without a version bump: backward reads the new values
                self.emit(SavedTensorReached(record.key))
        version = t._version
        if version != record.version:
            node = _compat.current_autograd_node()
            node_name = node.name() if node is not None else record.node
            original = RuntimeError(pytorch_stale_message(t, node_name, version, record.version))
            error = self._sink(StaleSavedTensorUsed(record.info(), node_name, version))
            # The traceback keeps this frame alive (autograd may hold the error
            # for a while): it must not keep the saved tensor alive too.
            del t, record
            if error is None:
                raise original
            written = getattr(error, "written_here", None)
            if written is not None:  # printed first: where the write ran, then PyTorch's error, then ours
                original.__cause__ = written
            raise error from original
        return t

    def progress(self) -> str:
        """How far the run got, for error messages."""
        where = ""
        ctx = self.modules.current
        if ctx is not None:
            where = f" in module {ctx[0] or '<root>'} ({ctx[2]})"
        return f"after {self.ops} ops, {self.saves} saved tensors{where}"

    def saved_records(self, storage_ptr: int) -> list[_SavedRecord]:
        """Records of the saved tensors autograd still holds on one storage, oldest first, named.

        A record holds its tensor: keep `record.place()`, not the record."""
        if self._pending_nodes:
            self._flush_nodes()
        bucket = self._by_storage.get(storage_ptr)
        if not bucket:
            return []
        return [r for _, ref in sorted(bucket.items()) if (r := ref()) is not None]

    def live_saved_tensors(self) -> int:
        return sum(len(b) for b in self._by_storage.values())

    # -- which node saved what --------------------------------------------
    def _on_node(self, node: Any) -> None:
        self._pending_nodes.append((node, self._last_op))

    def _flush_nodes(self) -> None:
        nodes, self._pending_nodes = self._pending_nodes, []
        for node, last_op in nodes:
            attrs = _saved_attrs(node)
            if not attrs:
                continue
            node_name = op = None
            custom = False
            for attr, field in attrs:
                try:
                    raw = getattr(node, attr)
                except RuntimeError:  # already freed
                    continue
                many = isinstance(raw, (tuple, list))
                for i, saved in enumerate(raw if many else (raw,)):
                    if not isinstance(saved, _compat.SavedTensor):
                        continue
                    record: Any = saved.data
                    if type(record) is not _SavedRecord or record.node is not None:
                        continue
                    if node_name is None:
                        node_name = node.name()
                        custom = isinstance(node, torch.autograd.function.BackwardCFunction)
                        if custom:
                            op = f"{node_name.removesuffix('Backward')}.apply"
                        elif last_op is not None:
                            op = op_name(last_op)
                    if custom:
                        field = "saved_tensors"  # what the user's backward reads: ctx.saved_tensors
                    record.node = node_name
                    record.field = f"{field}[{i}]" if many else field
                    record.op = op
                    record.read = saved_field_is_read(node, node_name, record.field)

    def emit(self, event: Event) -> None:
        """Hand an event to the sink; raise what it returns (fail-fast, or a stale tensor's error)."""
        error = self._sink(event)
        if error is None:
            return
        written = getattr(error, "written_here", None)
        if written is not None:
            raise error from written
        raise error

    # -- writes -----------------------------------------------------------
    def _call_before_write(self, written: list[torch.Tensor]) -> None:
        assert self._before_write is not None
        self._busy = True
        try:
            for t in written:
                self._before_write(t)
        finally:
            self._busy = False

    def _record_write(self, func: Any, written: list[torch.Tensor]) -> None:
        self.writes += 1
        if in_ddp_state_sync():  # DDP's deliberate, version-preserving sync: not the user's write
            return
        for t in written:
            self._record_written_tensor(func, t)

    def _record_written_tensor(self, func: Any, t: torch.Tensor) -> None:
        span = storage_span(t)
        if span is None:
            return
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
        if self.held.by_storage and _writes_bytes(func):
            held = self.held.overwritten_by(span, t)
        bucket = self._by_storage.get(span[0])
        candidates = []
        if bucket:
            for ref in bucket.values():
                record = ref()
                if record is not None:
                    candidates.append((ref, record.tensor._version))
        if not candidates and argument is None and not held:
            return
        info = self._write_info(func, t)
        for entry in held:  # reported if the stale alias is used as a snapshot afterwards
            entry.stale = HeldTensorOverwritten(info, entry.label, entry.site)
        if argument is not None:
            self.emit(CallerInputWritten(info, argument))
        if candidates:
            self._pending_writes.append(_PendingWrite(info, span, candidates, t))

    def _state_written_again(self, func: Any, t: torch.Tensor, span: tuple[int, int, int]) -> None:
        if self._forward_state.pop(span[0])() is None:  # that tensor died; its memory was reused
            return
        self.emit(SideEffectRepeated(self._write_info(func, t), "a tensor written in forward"))

    def _batch_norm_in_backward(self, func: Any, args: Any, kwargs: Any) -> None:
        """A training-mode batch norm running during backward is a recompute: its running stats update again."""
        training = args[5] if len(args) > 5 else kwargs.get("training")
        running_mean = args[3] if len(args) > 3 else kwargs.get("running_mean")
        if training and running_mean is not None:
            self.emit(SideEffectRepeated(self._write_info(func, running_mean), "BatchNorm running statistics"))

    def _write_info(self, func: Any, t: torch.Tensor) -> WriteInfo:
        frames, api, in_region = resolve_stack(capture_stack(), MAX_STACK)  # one capture: lines and region
        phase = "backward" if _compat.current_autograd_node() is not None else "forward"
        name = op_name(func)
        module = self.modules.current
        origin = self.modules.current_origin(tuple({f[0] for f in frames})) if module and module[3] else None
        return WriteInfo(
            site=make_site(name, frames, api, module, phase, origin),
            shape=tuple(t.shape),
            dtype=str(t.dtype).removeprefix("torch."),
            writes_bytes=_writes_bytes(func),
            in_checkpoint=in_region,
            target=self.modules.state_name(t),
        )

    # -- the caller's inputs ------------------------------------------------
    def set_caller_inputs(self, labelled: list[tuple[str, torch.Tensor]]) -> None:
        """Tensors a caller handed to the model: writes to them inside a module are reported."""
        self._inputs = {}
        for label, t in labelled:
            span = storage_span(t)
            if span is not None and span[0] not in self._inputs:
                self._inputs[span[0]] = (label, span)

    def _caller_argument(self, span: tuple[int, int, int]) -> str | None:
        entry = self._inputs.get(span[0])
        if entry is None or self.modules.current is None or not _overlaps(span, entry[1]):
            return None
        return entry[0]

    def _on_top_level_call(self, module: torch.nn.Module, args: Any) -> None:
        if not self._track_call_inputs:
            return
        if args is None:  # the call returned: what the caller does next is its own business
            self._inputs = {}
            return
        name = type(module).__name__
        self.set_caller_inputs([(f"argument {i} of {name}", t) for i, t in _labelled(args)])

    def _settle(self) -> None:
        """Decide what pending writes did, now that their version bumps happened."""
        writes, self._pending_writes = self._pending_writes, []
        if self._pending_nodes:
            self._flush_nodes()
        for write in writes:
            reported: set[tuple[Any, ...]] = set()  # one event per node a write hits (`a * a` saves a twice)
            for ref, version_before in write.candidates:
                record = ref()
                if record is None:
                    continue
                version_now = record.tensor._version
                shares = version_now != version_before
                if shares:
                    if version_now == record.version:
                        continue
                elif not (
                    write.info.writes_bytes
                    and record.read
                    and _overlaps(write.span, record.span())
                    and self._same_elements(write, record)
                ):
                    continue
                frames = record.where()[0]
                node_key = (record.node, frames[-1:])
                if record.node is not None and node_key in reported:
                    continue
                reported.add(node_key)
                record.overwritten = True
                self._overwritten_keys.add(record.key)
                self.emit(
                    SavedTensorOverwritten(
                        write=write.info,
                        saved=record.info(),
                        version_now=version_now,
                        shares_version_counter=shares,
                        already_used_by_backward=record.used,
                        write_bumped_a_version=shares or write.bumped(),
                    )
                )

    def _same_elements(self, write: _PendingWrite, record: _SavedRecord) -> bool:
        """Whether the write touched elements the saved tensor covers (not just the same byte range:
        `unsafe_chunk` pieces of one gate tensor interleave, as in LSTMCell's composite kernel)."""
        written = write.written()
        if written is None:
            return True
        self._busy = True
        try:
            return elements_overlap(written, record.tensor)
        finally:
            self._busy = False

    # -- errors PyTorch raised at an op -----------------------------------
    def describe_exception(self, exc: BaseException) -> InplaceErrorRaised:
        """Where an exception raised inside the traced code happened."""
        frames, api = frames_from_traceback(exc.__traceback__)
        if self._failed_op is not None and self._failed_op[0] == id(exc):
            op = op_name(self._failed_op[1])
        else:  # raised above the dispatcher (autograd's view and leaf checks)
            op = inplace_op_in_traceback(exc.__traceback__) or "<in-place op>"
        if self._error_module is not None and self._error_module[0] == id(exc):
            module = self._error_module[1]
        else:  # still inside the run: the module stack is as the error left it
            module = self.modules.current
        phase = "forward"
        site = make_site(op, frames, api, module, phase)
        return InplaceErrorRaised(exc, site, checkpoint_in_traceback(exc.__traceback__))


def _labelled(args: Any) -> list[tuple[str, torch.Tensor]]:
    """Top-level tensors of a call's positional arguments, by position."""
    return [(str(i), t) for i, t in enumerate(args) if isinstance(t, torch.Tensor)]


class _SubclassConstruction:
    """`MyTensor(t)` for a Tensor subclass without a `__new__` of its own, as without the tool.

    That call aliases `t` through the dispatcher; with any Python dispatch mode
    active the alias gets a plain `Tensor` Python object on its way through the
    mode, and the subclass construction then fails ("the raw Tensor object is
    already associated to a python object of type Tensor"). While tracing,
    `torch.Tensor.__new__` runs with our mode off the stack (only when it is on
    top); `alias` writes nothing, so nothing is missed. Undone on exit.
    """

    def __init__(self, mode: _DispatchMode) -> None:
        self.mode = mode
        self.installed = False

    def __enter__(self) -> "_SubclassConstruction":
        if "__new__" in torch.Tensor.__dict__:
            return self  # someone else's __new__: leave it alone
        from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode_temporarily

        base_new = torch._C.TensorBase.__new__
        mode = self.mode

        def __new__(cls: Any, *args: Any, **kwargs: Any) -> Any:
            if _get_current_dispatch_mode() is mode:
                with _pop_mode_temporarily():
                    return base_new(cls, *args, **kwargs)
            return base_new(cls, *args, **kwargs)

        torch.Tensor.__new__ = staticmethod(__new__)  # type: ignore[assignment]
        self.installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self.installed:
            del torch.Tensor.__new__
            self.installed = False


class _NodeHookContext:
    def __exit__(self, *exc: object) -> None:
        _compat.pop_node_creation_hook()


_saved_attr_cache: dict[type, tuple[tuple[str, str], ...]] = {}


def _saved_attrs(node: Any) -> tuple[tuple[str, str], ...]:
    """(`_raw_saved_<field>` attribute, field) of each tensor field a node type saves."""
    cls = type(node)
    attrs = _saved_attr_cache.get(cls)
    if attrs is None:
        prefix = _compat.RAW_SAVED_PREFIX
        attrs = tuple((a, a[len(prefix) :]) for a in dir(node) if a.startswith(prefix))
        _saved_attr_cache[cls] = attrs
    return attrs


def _overlaps(a: tuple[int, int, int], b: tuple[int, int, int] | None) -> bool:
    return b is not None and a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def pytorch_stale_message(t: torch.Tensor, node: str | None, version: int, expected: int) -> str:
    """PyTorch's own wording for a stale saved tensor (its check is off under our hooks)."""
    shape = list(t.shape)
    return (
        "one of the variables needed for gradient computation has been modified by an inplace "
        f"operation: [{t.type()} {shape}], which is saved by {node or 'an autograd node'}, is at "
        f"version {version}; expected version {expected} instead."
    )


__all__ = ["Tracer", "Site", "op_name", "write_spec", "storage_span", "pytorch_stale_message"]
