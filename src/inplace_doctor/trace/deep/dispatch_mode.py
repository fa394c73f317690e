"""The deep tracer's `TorchDispatchMode`: every aten op of the run passes through it once."""

from __future__ import annotations

from typing import Any

import torch

from ... import _compat
from ..checkpoint.checkpoint_blocks import RegionCount, open_region
from ..checkpoint.recompute import RecomputeCheck
from ..ops import restores_version_bump
from ..owner import Busy
from ..places.nodes import origin_of
from ..process.shared_patches import ABSENT, Shared, SharedPatch
from ..raised.blame import passed_through
from ..raised.pytorch_errors import RaisedErrors
from ..reads.aliases import HeldTensors
from ..reads.graph_writes import UnrecordedWrites
from ..reads.inplace_calls import InplaceCalls
from ..saves.saved import SavedTensors
from ..saves.storage import storage_span
from ..writes import WriteRecorder
from .per_op import PerOpMode, record_failure


class TracingMode(PerOpMode):
    """Before each op: settle what earlier ops did, look for reads of overwritten values; after: record its writes.

    One per tracer, entered each time the tracer is; `ops` counts what it saw. The preamble is
    `PerOpMode`'s; the work at each op, in its order, is this class's own.
    """

    def __init__(
        self,
        busy: Busy,
        saved: SavedTensors,
        writes: WriteRecorder,
        inplace_calls: InplaceCalls,
        held: HeldTensors,
        raised: RaisedErrors,
        graph: UnrecordedWrites,
        recompute: RecomputeCheck | None = None,
        own_pack: Any = None,
    ) -> None:
        super().__init__(busy)
        self.saved = saved
        self.writes = writes
        self.inplace_calls = inplace_calls
        self.held = held
        self.caller_reads = writes.caller_reads
        self.caller_awaiting = writes.caller_reads.awaiting  # one lookup per op while it is empty
        self.raised = raised
        self.graph = graph
        self.recompute = recompute
        self.own_pack = own_pack  # the tracer's pack hook: on top of the hooks outside checkpoint regions

    def run(self, func: Any, args: Any, kwargs: Any, written: list[torch.Tensor] | None, batch_norm: bool) -> Any:  # noqa: C901 - once per aten op: a helper is a Python call per op on the measured overhead
        saved, writes = self.saved, self.writes
        if saved.pending_nodes:
            saved.flush_nodes()
        if writes.pending:
            writes.settle()
        graph = self.graph
        if graph.awaiting:
            graph.resolve()
        self.ops += 1
        if written and writes.before_write is not None:
            writes.call_before_write(written)
        if written and saved.by_storage:
            writes.before_write_through_alias(func, written)
        node = _compat.current_autograd_node()  # not None inside backward: the node running
        if self.inplace_calls.overwritten and node is None:
            self.inplace_calls.check_reads(func, args, kwargs)  # before the op: the values it reads
        stale_read = self.held.check_uses(func, args, kwargs, written) if self.held.stale_ids else None
        if self.caller_awaiting and node is None:
            self.caller_reads.check_reads(func, args, kwargs, written)
        if node is None:
            if func is _DETACH:
                graph.detached(args[0] if args else None)
            elif graph.watching:
                graph.check_uses(func, args, kwargs, written)
        region = None
        if RegionCount.n and self.recompute is not None:  # a checkpoint region is open (on some thread)
            region = open_region(self.own_pack)
            if region is not None and written:  # an op that saved what it writes: its value before the kernel
                self.recompute.before_write(region, func, args, kwargs)
        try:
            out = func(*args, **kwargs)
        except BaseException as exc:
            passed_through(exc)
            record_failure(self.raised, func, exc, node)
            raise
        if node is not None:  # in backward: what ran last, for errors autograd raises after a node
            self.raised.last_node = origin_of(node)
        saved.last_op = func
        if stale_read is not None:  # `.detach()`/`.data` of a stale state_dict() alias: the same alias
            self.held.alias_of_stale(stale_read, out)
        if graph.used is not None:
            graph.after_op(out)
        if region is not None:
            self.recompute.after_op(region, func, args, kwargs, out, written)  # type: ignore[union-attr]
        if batch_norm and node is not None:
            writes.batch_norm_in_backward(func, args, kwargs)
        if written:
            writes.record(func, written, func is _COPY and copies_onto_itself(args))
            if node is None:
                graph.written(func, args, written)
            if restores_version_bump(func):
                torch.autograd.graph.increment_version([t for t in written if not t.is_inference()])
        return out


_COPY = torch.ops.aten.copy_.default
_DETACH = torch.ops.aten.detach.default


def copies_onto_itself(args: Any) -> bool:
    """`dst.copy_(src)` where src is dst's own memory, element for element: the values stay."""
    if len(args) < 2 or not isinstance(args[1], torch.Tensor):
        return False
    dst, src = args[0], args[1]
    return (
        dst.dtype == src.dtype
        and dst.shape == src.shape
        and dst.stride() == src.stride()
        and storage_span(dst) == storage_span(src)
        and storage_span(dst) is not None
    )


class SubclassConstruction:
    """`MyTensor(t)` for a Tensor subclass without a `__new__` of its own, as without the tool.

    That call aliases `t` through the dispatcher; with any Python dispatch mode
    active the alias gets a plain `Tensor` Python object on its way through the
    mode, and the subclass construction then fails ("the raw Tensor object is
    already associated to a python object of type Tensor"). While tracing,
    `torch.Tensor.__new__` runs with our mode off the stack (only when it is on
    top); `alias` writes nothing, so nothing is missed. One `__new__` for all
    tracers, set by the first in and deleted by the last out, in any order.
    """

    def __init__(self, *modes: _compat.TorchDispatchMode) -> None:
        self.modes = modes  # the tool's modes (the fast tracer has two, each pushed only at times)

    def __enter__(self) -> SubclassConstruction:
        _NEW.acquire(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _NEW.release(self)


def _construction(original: Any) -> Any:
    if original is not ABSENT:
        return None  # someone else's __new__: leave it alone
    from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode_temporarily

    base_new = torch._C.TensorBase.__new__

    def __new__(cls: Any, *args: Any, **kwargs: Any) -> Any:
        top = _get_current_dispatch_mode()
        if top is not None and any(top is mode for user in _NEW.users for mode in user.modes):
            with _pop_mode_temporarily():
                return base_new(cls, *args, **kwargs)
        return base_new(cls, *args, **kwargs)

    return staticmethod(__new__)


_NEW: SharedPatch[SubclassConstruction] = SharedPatch(torch.Tensor, "__new__", _construction)


class EnteredMode:
    """Context manager: `mode` entered as PyTorch enters a mode, which sets three process-wide flags
    (`torch.utils._python_dispatch`: in a dispatch mode, in a non-infra one, in one that does not
    ignore compile internals) and puts back on exit what they were at its entry: wrong when two
    threads' modes end out of order. Here they stay set while any tracer's mode is in, and are what
    they were before the first once the last has left."""

    def __init__(self, mode: _compat.TorchDispatchMode) -> None:
        self.mode = mode

    def __enter__(self) -> EnteredMode:
        _FLAGS.acquire(self)
        try:
            self.mode.__enter__()
        except BaseException:
            _FLAGS.release(self)
            raise
        _FLAG_VALUES[1] = _read_flags()
        return self

    def __exit__(self, *exc: object) -> None:
        self.mode.__exit__(None, None, None)
        if len(_FLAGS.entries) > 1:  # another tracer's mode is still in: it set them, they stay
            _write_flags(_FLAG_VALUES[1])
        _FLAGS.release(self)


def _read_flags() -> dict[str, Any]:
    import torch.utils._python_dispatch as python_dispatch

    return {name: getattr(python_dispatch, name) for name in _FLAG_NAMES if hasattr(python_dispatch, name)}


def _write_flags(values: dict[str, Any] | None) -> None:
    import torch.utils._python_dispatch as python_dispatch

    for name, value in (values or {}).items():
        setattr(python_dispatch, name, value)
    tell = getattr(python_dispatch, "set_is_in_mode_without_ignore_compile_internals", None)
    if tell is not None and values and _FLAG_NAMES[2] in values:
        tell(values[_FLAG_NAMES[2]])  # the C++ copy of the third flag


_FLAG_NAMES = (
    "_is_in_torch_dispatch_mode", "_is_in_non_infra_torch_dispatch_mode", "_is_in_any_mode_without_ignore_compile_internals"
)
#: the flags before the first tracer's mode entered, and while one is in
_FLAG_VALUES: list[dict[str, Any] | None] = [None, None]
_FLAGS: Shared[EnteredMode] = Shared(
    lambda: _FLAG_VALUES.__setitem__(0, _read_flags()), lambda: _write_flags(_FLAG_VALUES[0])
)
