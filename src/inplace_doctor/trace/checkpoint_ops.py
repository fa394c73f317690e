"""The fast tracer's per-op interception inside checkpoint regions (issue 26): IPD108, IPD111.

The fast tracer sees no op but writes. A `torch.utils.checkpoint` region's
forward and recompute need every op: the recompute is compared with the
forward op by op (`recompute.py`, IPD111), and a training-mode batch norm
running during backward is a recompute updating the running statistics again
(IPD108; that update is no dispatch-visible write). `RegionOps` pushes a
dispatch mode on the thread running a region while it runs, and pops it when
the region's outermost block ends:

- a non-reentrant region's forward and recompute: the `with` blocks of
  checkpoint's two saved-tensor hook classes (`RegionCount` wraps their
  `__enter__`/`__exit__` while a tracer runs);
- the reentrant form's recompute: the backward of an `autograd.Function`
  named like a checkpoint (`CheckpointFunction`: torch's, DeepSpeed's,
  Megatron's, fairscale's), seen by wrapping `BackwardCFunction.apply` while
  a fast tracer runs (one Python call per custom Function's backward; its
  forward runs under `no_grad` and needs nothing).

Inside, each op does what the deep tracer's mode does for these two rules,
in its order; elsewhere no op enters Python, and a program without
checkpoint pays nothing. A block belongs to the tracer of the context that
entered it, or, on a thread autograd runs backward on (which carries the
caller's saved-tensor hooks but not its context), to the tracer whose
saved-tensor hooks are the caller's.

Known limitations: a reentrant checkpoint whose `autograd.Function` is named
otherwise runs its recompute without the mode: a batch norm there is not seen
(the deep tracer sees every batch norm in backward).
"""

from __future__ import annotations

import contextvars
import threading
from typing import Any

import torch
from torch.autograd.function import BackwardCFunction

from .. import _compat
from .blame import passed_through
from .nodes import origin_of
from .ops import _op_facts, op_facts, written_tensors
from .owner import Busy
from .pytorch_errors import RaisedErrors
from .checkpoint_blocks import RegionCount
from .recompute import RecomputeCheck
from .writes import WriteRecorder

_OWNER: contextvars.ContextVar["RegionOps | None"] = contextvars.ContextVar("inplace_doctor_regions", default=None)


class _RegionMode(_compat.TorchDispatchMode):
    """Pass-through for a region's ops: the recompute comparison and batch norms in backward."""

    def __init__(
        self, busy: Busy, writes: WriteRecorder, raised: RaisedErrors, recompute: RecomputeCheck | None, own_pack: Any
    ) -> None:
        super().__init__()
        self.busy = busy
        self.writes = writes
        self.raised = raised
        self.recompute = recompute
        self.own_pack = own_pack
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        """What `dispatch_mode.TracingMode` does for IPD108 and IPD111, in its order (writes are the kernels')."""
        if kwargs is None:
            kwargs = {}
        if self.busy.on:
            return func(*args, **kwargs)
        self.ops += 1
        _, spec, batch_norm = _op_facts.get(id(func)) or op_facts(func)
        written = written_tensors(spec, args, kwargs) if spec else None
        node = _compat.current_autograd_node()
        region = None
        recompute = self.recompute
        if recompute is not None:
            hooks = _compat.top_saved_tensors_hooks(False)
            if hooks is not None and hooks[0] is not self.own_pack:
                region = _compat.checkpoint_region(hooks[0])
                if region is not None and written:
                    recompute.before_write(region, func, args, kwargs)
        try:
            out = func(*args, **kwargs)
        except BaseException as exc:
            passed_through(exc)
            self.raised.failed_op = (id(exc), func)  # by id, as the deep tracer keeps it
            if node is not None:
                self.raised.failed_node = (id(exc), origin_of(node))
            raise
        if node is not None:
            self.raised.last_node = origin_of(node)
        if region is not None:
            recompute.after_op(region, func, args, kwargs, out, written)  # type: ignore[union-attr]
        if batch_norm and node is not None:
            self.writes.batch_norm_in_backward(func, args, kwargs)
        return out


class RegionOps:
    """Context manager: `_RegionMode` on a thread while it runs a checkpoint region, for one fast tracer.

    `regions` counts the outermost blocks that turned the mode on.
    """

    def __init__(
        self, busy: Busy, writes: WriteRecorder, raised: RaisedErrors, recompute: RecomputeCheck | None, own_pack: Any
    ) -> None:
        self.mode = _RegionMode(busy, writes, raised, recompute, own_pack)
        self._own_pack = own_pack
        self._depth = threading.local()
        self._token: contextvars.Token[RegionOps | None] | None = None
        self.regions = 0

    def __enter__(self) -> "RegionOps":
        self._token = _OWNER.set(self)
        RegionCount.watchers.append(self)
        _REENTRANT.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        if getattr(self._depth, "n", 0):  # left inside a region (the program's blocks out of order)
            self._depth.n = 0
            _remove_mode(self.mode)
        _REENTRANT.release()
        if self in RegionCount.watchers:
            RegionCount.watchers.remove(self)
        if self._token is not None:
            _OWNER.reset(self._token)
            self._token = None

    def region_entered(self, outer_hooks: Any) -> bool:
        """A region's block starts on this thread (`outer_hooks`: the saved-tensor hooks around it):
        True when it is this tracer's, the mode then on until the outermost such block ends."""
        depth = getattr(self._depth, "n", 0)
        if not depth and _OWNER.get() is not self and (outer_hooks is None or outer_hooks[0] is not self._own_pack):
            return False
        if not depth:
            _compat.push_dispatch_mode(self.mode)
            self.regions += 1
        self._depth.n = depth + 1
        return True

    def region_exited(self) -> None:
        depth = getattr(self._depth, "n", 0) - 1
        if depth < 0:
            return  # its mode was taken off when the tracer left inside the region
        self._depth.n = depth
        if not depth:
            _remove_mode(self.mode)


def _remove_mode(mode: Any) -> None:
    """Take `mode` off this thread's dispatch-mode stack; modes pushed above it since stay, in order."""
    length = torch._C._len_torch_dispatch_stack()
    if not any(torch._C._get_dispatch_stack_at(i) is mode for i in range(length)):
        return
    above = []
    while True:
        popped = _compat.pop_dispatch_mode(None)
        if popped is mode:
            break
        above.append(popped)
    for other in reversed(above):
        _compat.push_dispatch_mode(other)


class _ReentrantBackward:
    """`BackwardCFunction.apply` wrapped while a fast tracer runs: the backward of an `autograd.Function`
    named like a checkpoint (torch's `CheckpointFunction`, and DeepSpeed's, Megatron's, fairscale's of
    that name) is a reentrant recompute, run with the mode on; any other Function's runs as before."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.original: Any = None

    def acquire(self) -> None:
        with self.lock:
            self.users += 1
            if self.users > 1:
                return
            self.original = apply = BackwardCFunction.__dict__["apply"]

            def recompute_seen(node: Any, *grads: Any) -> Any:
                if not _recomputes(node._forward_cls):
                    return apply(node, *grads)
                owner = RegionCount.watcher_for(_compat.top_saved_tensors_hooks(False))
                try:
                    return apply(node, *grads)
                finally:
                    if owner is not None:
                        owner.region_exited()

            BackwardCFunction.apply = recompute_seen  # type: ignore[method-assign]

    def release(self) -> None:
        with self.lock:
            self.users -= 1
            if self.users == 0 and self.original is not None:
                BackwardCFunction.apply = self.original  # type: ignore[method-assign]
                self.original = None


_recomputing: dict[type, bool] = {}


def _recomputes(function: type) -> bool:
    """Whether a Function's backward is a reentrant checkpoint's recompute, by its name (cached)."""
    known = _recomputing.get(function)
    if known is None:
        known = _recomputing[function] = "checkpoint" in function.__name__.lower()
    return known


_REENTRANT = _ReentrantBackward()


__all__ = ["RegionOps"]
