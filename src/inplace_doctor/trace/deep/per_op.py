"""The tracer's per-op dispatch mode: one class, each user registering what it does at an op.

The deep tracer sees every aten op through `dispatch_mode.TracingMode`, a
`PerOpMode` that does everything there. The fast tracer sees no op but writes,
and pushes a `PerOpMode` only while a rule waits for something only ops show:

- `pending_reads.PendingReads`: a stale `state_dict()` alias or a graph tensor
  changed outside autograd awaiting its use (IPD107, IPD110);
- `checkpoint_ops.RegionOps`: a checkpoint region's forward or recompute
  running (IPD108, IPD111);
- `suspect_calls.SuspectCalls`: a call handed an object whose read is awaited
  (IPD105, IPD106; forward ops only).

Each hands its mode an `OpWork`: what it checks before the op (its result is
handed back after), after the op, and when the op raised. The preamble (the
tool's own ops passed through, the tensors the op writes) and the call of the
op are written here once, for all of them.
"""

from __future__ import annotations

from typing import Any

import torch

from ... import _compat
from ..ops import _op_facts, op_facts, written_tensors
from ..owner import Busy
from ..places.nodes import origin_of
from ..raised.blame import call_through, passed_through
from ..raised.pytorch_errors import RaisedErrors


class OpWork:
    """What a user of `PerOpMode` does at each op it sees; by default nothing."""

    def before(self, func: Any, args: Any, kwargs: Any, written: list[torch.Tensor] | None, node: Any) -> Any:
        """Before the op runs (`node`: the autograd node running, None in forward); the result goes to `after`."""
        return None

    def after(
        self, token: Any, func: Any, args: Any, kwargs: Any, out: Any, written: list[torch.Tensor] | None,
        batch_norm: bool, node: Any,
    ) -> None:
        """After the op returned `out`."""

    def failed(self, func: Any, exc: BaseException, node: Any) -> None:
        """The op raised `exc` (re-raised after this)."""


class PerOpMode(_compat.TorchDispatchMode):
    """Pass-through: each op the program runs handed to one `OpWork`; the tool's own ops untouched.

    `forward_only`: ops inside backward pass straight through. `ops` counts the ops handed over.
    """

    def __init__(self, busy: Busy, work: OpWork | None = None, forward_only: bool = False) -> None:
        super().__init__()
        self.busy = busy
        self.work = work if work is not None else OpWork()
        self.forward_only = forward_only
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if kwargs is None:
            kwargs = {}
        if self.busy.on:
            return func(*args, **kwargs)
        _, spec, batch_norm = _op_facts.get(id(func)) or op_facts(func)
        written = written_tensors(spec, args, kwargs) if spec else None
        return self.run(func, args, kwargs, written, batch_norm)

    def run(self, func: Any, args: Any, kwargs: Any, written: list[torch.Tensor] | None, batch_norm: bool) -> Any:
        """One op of the program's, with its written tensors known."""
        node = _compat.current_autograd_node()  # not None inside backward: the node running
        if node is not None and self.forward_only:
            return call_through(func, args, kwargs)
        self.ops += 1
        work = self.work
        token = work.before(func, args, kwargs, written, node)
        try:
            out = func(*args, **kwargs)
        except BaseException as exc:
            passed_through(exc)
            work.failed(func, exc, node)
            raise
        work.after(token, func, args, kwargs, out, written, batch_norm, node)
        return out


def record_failure(raised: RaisedErrors, func: Any, exc: BaseException, node: Any) -> None:
    """The op that raised, for the error's description (and inside backward the node whose backward
    failed). By id: holding the exception would hold its traceback's frames, the graph, and through
    the tool's hooks the tracer: a cycle gc cannot see."""
    raised.failed_op = (id(exc), func)
    if node is not None:
        raised.failed_node = (id(exc), origin_of(node))


def disable_dynamo_directly() -> None:
    """Wrap `PerOpMode.__torch_dispatch__` in `torch._dynamo.disable` itself, once.

    torch wraps every mode's `__torch_dispatch__` in `torch._disable_dynamo`,
    so that a compiled function called while the mode is active never traces
    the mode. Its lazy-import layer is one more Python call per op: about 3 %
    of a small model's step. `torch._dynamo.disable` gives the same protection
    without it (torch's wrapper imports torch._dynamo at the first op anyway).
    """
    current = PerOpMode.__dict__["__torch_dispatch__"]
    raw = getattr(current, "__wrapped__", None)
    if raw is None or getattr(current, "_torchdynamo_disable", False):
        return  # not wrapped by this torch, or done already
    try:
        import torch._dynamo
    except Exception:  # a platform without dynamo: keep torch's own wrapper
        return
    PerOpMode.__torch_dispatch__ = torch._dynamo.disable(raw, recursive=True)  # type: ignore[method-assign]


__all__ = ["OpWork", "PerOpMode", "disable_dynamo_directly", "record_failure"]
