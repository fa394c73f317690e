"""The fast tracer's writes (issue 26): `WriteKernels` feeding the same `WriteRecorder` the dispatch mode feeds.

Before a write runs: what the dispatch mode does before an op that writes
(the caller's snapshot hook, saved bytes fingerprinted before a write through
`.data`), and the write recorded against the versions of the saved tensors on
its memory. After the version bump: the write settled at once (no next op to
wait for: no op but writes enters Python), so `SavedTensorOverwritten` is
emitted at the line that wrote.

Known limitations: writes made while `torch.compile` traces (fake and
functional tensors) are skipped; the tracer runs compiled code eagerly anyway.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import torch

from ... import _compat
from ..deep.dispatch_mode import copies_onto_itself
from ..owner import Busy
from ..places.nodes import origin_of, saved_attrs
from ..raised.pytorch_errors import RaisedErrors
from ..writes import WriteRecorder
from .pending_reads import PendingReads
from .saved_fast import FastSavedTensors
from .write_kernels import WriteKernels

_COPY = torch.ops.aten.copy_.default
_CAMEL = re.compile(r"(?<!^)(?<![0-9])(?=[A-Z])")  # `MaxPool2DWithIndices`: max_pool2d_with_indices
_has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
_grad_enabled = torch.is_grad_enabled
# Nodes whose name is not their op's (the op that creates them is a private one).
_RENAMED = {"Softmax": "_softmax", "LogSoftmax": "_log_softmax", "UnsafeView": "_unsafe_view"}
_op_of_node: dict[str, Any] = {}
_UNKNOWN = object()


def op_of_node(name: str) -> Any:
    """The aten op (any overload: only its name is read) a node like `AddmmBackward0` is created by,
    or None. The deep tracer knows it as the op it saw last; the fast one sees no op but writes."""
    op = _op_of_node.get(name, _UNKNOWN)
    if op is not _UNKNOWN:
        return op
    base = re.sub(r"Backward\d*$", "", name.rsplit("::", 1)[-1])
    snake = _RENAMED.get(base) or _CAMEL.sub("_", base).lower()
    # The op with an autograd kernel of its own makes the node (`_cdist_forward`, not the composite
    # `cdist` calling it: the deep tracer sees that one last); else the first op of the name found.
    found = []
    for candidate in (snake, "_" + snake, snake + "_forward", "_" + snake + "_forward"):
        packet = getattr(torch.ops.aten, candidate, None) if candidate.isidentifier() else None
        overloads = packet.overloads() if packet is not None else []
        if overloads:
            found.append(getattr(packet, overloads[0]))
    op = next((op for op in found if _has_kernel(op.name(), "Autograd")), found[0] if found else None)
    _op_of_node[name] = op
    return op


_BackwardCFunction = torch.autograd.function.BackwardCFunction
# A leaf's gradient sink, made when the leaf first enters a graph (before the saves of the op that
# uses it): it saves nothing, and no report names where it was made (a leaf has no `grad_fn`).
_ACCUMULATE_GRAD = getattr(getattr(torch._C, "_functions", None), "AccumulateGrad", None)


class _NodeKind(NamedTuple):
    """What the node-creation hook needs of a node, the same for every node of its type."""

    name: str
    op: Any  # the op that makes it; None for a custom Function's (or an op not known)
    view_write: bool  # CopySlices: made by the write whose kernel returned last, that write is its op
    after_view_write: bool  # AsStridedBackward: CopySlices makes one first, the write stays the op
    saves: bool  # it has fields that save tensors
    inplace: str | None  # the in-place variant of its op (`relu_`): made by that write, it is the op


_node_kinds: dict[type, _NodeKind] = {}  # C++ node types: a type of their own per node name


def _kind_of(node: Any) -> _NodeKind:
    name = node.name()
    custom = isinstance(node, _BackwardCFunction)
    op = None if custom else op_of_node(name)
    kind = _NodeKind(
        name, op, name.endswith("CopySlices"), name.startswith("AsStridedBackward"), bool(saved_attrs(node)),
        op._overloadpacket.__name__ + "_" if op is not None else None,
    )
    if not custom and type(node).__name__ == name.rsplit("::", 1)[-1]:
        _node_kinds[type(node)] = kind  # not a custom Function's type: those may be made per call
    return kind


def _traced_by_the_compiler(written: list[torch.Tensor]) -> bool:
    return any(type(t).__module__.startswith("torch._subclasses") for t in written)


class FastWrites:
    """Context manager: writes of this context recorded through the kernels, not a dispatch mode.

    `ops` counts the writes it saw (the fast tracer sees no other op).
    """

    def __init__(
        self, busy: Busy, saved: FastSavedTensors, writes: WriteRecorder, raised: RaisedErrors,
        reads: PendingReads | None = None,
    ) -> None:
        self._busy = busy
        self._reads = reads  # per-op interception while a read is awaited (IPD107)
        self._raised = raised
        self._saved = saved
        self._writes = writes
        self.ops = 0
        self._last_write: Any = None
        self._args: Any = None  # the arguments of the write running now, while `reads` needs them  # the write whose kernel returned last: the op of the node made next
        self._kernels = WriteKernels(self._after, self._before, self._failed)

    def _before(self, func: Any, written: list[torch.Tensor], args: Any) -> None:
        if self._busy.on or not written or _traced_by_the_compiler(written):
            return
        self.ops += 1
        saved, writes = self._saved, self._writes
        if saved.pending_nodes:
            saved.flush_nodes()
        if writes.pending:
            writes.settle()
        if writes.before_write is not None:
            writes.call_before_write(written)
        if saved.by_storage:
            writes.before_write_through_alias(func, written)
        with self._busy:  # the tracer's own torch calls are not the program's writes
            writes.record(func, written, func is _COPY and copies_onto_itself(args))
        if self._reads is not None:
            self._args = args  # for the graph-tensor check after the write (IPD110)

    def on_node(self, node: Any) -> None:
        """The node-creation hook: the op that made the node named from it (the deep tracer's last
        op), its saved tensors named at once (a node held until later would keep a graph dropped
        without backward alive), and where it was made recorded in it."""
        if type(node) is _ACCUMULATE_GRAD:  # one per parameter a step: nothing to record
            self._last_write = None
            if self._writes.pending and not self._busy.on and _awaits_its_node(self._writes.pending):
                self._writes.settle()
            return
        kind = _node_kinds.get(type(node))  # a C++ node type's: never a custom Function's
        custom = False
        if kind is None:
            kind = _kind_of(node)
            custom = isinstance(node, _BackwardCFunction)
        last_write, op = self._last_write, kind.op
        if last_write is not None:
            if not kind.after_view_write:
                self._last_write = None
            # a node of the write's own op made by it (`relu_`'s ReluBackward0), as the deep tracer names
            # it (a write in grad mode that made none, its tensors needing no grad, may still pass this)
            if kind.view_write or kind.inplace == last_write._overloadpacket.__name__:
                op = last_write
        self._saved.on_node_now(node, op, kind.name if kind.saves else None)
        if custom:  # a custom Function: autograd may name it in an error
            self._raised.custom_nodes[kind.name] = origin_of(node)
        pending = self._writes.pending
        if pending and not self._busy.on and _awaits_its_node(pending):
            self._writes.settle()

    def _failed(self, func: Any, exc: BaseException) -> None:
        """PyTorch raised at a write (into an expanded tensor): the op, for the error's description.
        By id, as the dispatch mode keeps it: holding the exception would hold its frames."""
        self._raised.failed_op = (id(exc), func)
        node = _compat.current_autograd_node()
        if node is not None:  # inside backward: the node whose backward failed
            self._raised.failed_node = (id(exc), origin_of(node))

    def _after(self, func: Any, written: list[torch.Tensor]) -> None:
        self._last_write = func if _grad_enabled() else None  # no node follows a write in no-grad mode
        pending = self._writes.pending
        if pending and not self._busy.on and not _awaits_its_node(pending):
            self._writes.settle()
        reads = self._reads
        if reads is None:
            return
        args, self._args = self._args, None
        if args is not None and not self._busy.on and _compat.current_autograd_node() is None:
            reads.graph.written(func, args, written)  # a forward write autograd does not record (IPD110)
        if reads.asked():
            reads.update()

    def __enter__(self) -> FastWrites:
        self._kernels.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._kernels.__exit__(*exc)


def _awaits_its_node(pending: list[Any]) -> bool:
    """A write by a kernel that writes what its own node saved (`F.rrelu`'s noise,
    `saved_writes.py`): autograd names that node only after the kernel returns, so the write
    is settled from the node-creation hook, once it can be told apart from an earlier call's save."""
    return any(write.own_save is not None for write in pending)
