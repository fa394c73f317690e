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
from typing import Any

import torch

from .owner import Busy
from .pytorch_errors import RaisedErrors
from .saved import SavedTensors
from .write_kernels import WriteKernels
from .writes import WriteRecorder


_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
# Nodes whose name is not their op's (the op that creates them is a private one).
_RENAMED = {"Softmax": "_softmax", "LogSoftmax": "_log_softmax", "UnsafeView": "_unsafe_view"}
_op_of_node: dict[str, Any] = {}


def op_of_node(name: str) -> Any:
    """The aten op (any overload: only its name is read) a node like `AddmmBackward0` is created by,
    or None. The deep tracer knows it as the op it saw last; the fast one sees no op but writes."""
    if name in _op_of_node:
        return _op_of_node[name]
    base = re.sub(r"Backward\d*$", "", name.rsplit("::", 1)[-1])
    snake = _RENAMED.get(base) or _CAMEL.sub("_", base).lower()
    op = None
    for candidate in (snake, "_" + snake):
        packet = getattr(torch.ops.aten, candidate, None) if candidate.isidentifier() else None
        overloads = packet.overloads() if packet is not None else []
        if overloads:
            op = getattr(packet, overloads[0])
            break
    _op_of_node[name] = op
    return op


def _traced_by_the_compiler(written: list[torch.Tensor]) -> bool:
    return any(type(t).__module__.startswith("torch._subclasses") for t in written)


class FastWrites:
    """Context manager: writes of this context recorded through the kernels, not a dispatch mode.

    `ops` counts the writes it saw (the fast tracer sees no other op).
    """

    def __init__(self, busy: Busy, saved: SavedTensors, writes: WriteRecorder, raised: RaisedErrors) -> None:
        self._busy = busy
        self._raised = raised
        self._saved = saved
        self._writes = writes
        self.ops = 0
        self._kernels = WriteKernels(self._after, self._before, self._failed)

    def _before(self, func: Any, written: list[torch.Tensor]) -> None:
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
            writes.record(func, written)

    def on_node(self, node: Any) -> None:
        """The node-creation hook: the saving op named from the node, as the deep tracer's last op."""
        if not isinstance(node, torch.autograd.function.BackwardCFunction):
            self._saved.last_op = op_of_node(node.name())
        else:
            self._saved.last_op = None
        self._saved.on_node(node)

    def _failed(self, func: Any, exc: BaseException) -> None:
        """PyTorch raised at a write (into an expanded tensor): the op, for the error's description.
        By id, as the dispatch mode keeps it: holding the exception would hold its frames."""
        self._raised.failed_op = (id(exc), func)

    def _after(self, func: Any, written: list[torch.Tensor]) -> None:
        if self._writes.pending and not self._busy.on:
            self._writes.settle()

    def __enter__(self) -> "FastWrites":
        self._kernels.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._kernels.__exit__(*exc)
