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
import weakref
from typing import Any

import torch
from torch.autograd.function import BackwardCFunction

from ... import _compat
from ..deep.per_op import OpWork, PerOpMode, record_failure
from ..owner import Busy
from ..places.nodes import origin_of
from ..raised.pytorch_errors import RaisedErrors
from ..writes import WriteRecorder
from .checkpoint_blocks import RegionCount, open_region
from .recompute import RecomputeCheck

_OWNER: contextvars.ContextVar[RegionOps | None] = contextvars.ContextVar("inplace_doctor_regions", default=None)


class _RegionWork(OpWork):
    """What `dispatch_mode.TracingMode` does for IPD108 and IPD111, in its order (writes are the kernels'):
    the recompute compared with the forward, batch norms in backward."""

    def __init__(self, writes: WriteRecorder, raised: RaisedErrors, recompute: RecomputeCheck | None, own_pack: Any) -> None:
        self.writes = writes
        self.raised = raised
        self.recompute = recompute
        self.own_pack = own_pack

    def before(self, func: Any, args: Any, kwargs: Any, written: list[torch.Tensor] | None, node: Any) -> Any:
        recompute = self.recompute
        if recompute is None:
            return None
        region = open_region(self.own_pack)
        if region is not None and written:
            recompute.before_write(region, func, args, kwargs)
        return region

    def after(
        self, region: Any, func: Any, args: Any, kwargs: Any, out: Any, written: list[torch.Tensor] | None,
        batch_norm: bool, node: Any,
    ) -> None:
        if node is not None:
            self.raised.last_node = origin_of(node)
        if region is not None:
            self.recompute.after_op(region, func, args, kwargs, out, written)  # type: ignore[union-attr]
        if batch_norm and node is not None:
            self.writes.batch_norm_in_backward(func, args, kwargs)

    def failed(self, func: Any, exc: BaseException, node: Any) -> None:
        record_failure(self.raised, func, exc, node)


class RegionOps:
    """Context manager: a `PerOpMode` doing `_RegionWork` on a thread while it runs a checkpoint region, for one fast tracer.

    `regions` counts the outermost blocks that turned the mode on.
    """

    def __init__(
        self, busy: Busy, writes: WriteRecorder, raised: RaisedErrors, recompute: RecomputeCheck | None, own_pack: Any
    ) -> None:
        self.mode = PerOpMode(busy, _RegionWork(writes, raised, recompute, own_pack))
        self._own_pack = own_pack
        self._depth = threading.local()
        self._token: contextvars.Token[RegionOps | None] | None = None
        self.regions = 0

    def __enter__(self) -> RegionOps:
        self._token = _OWNER.set(self)
        RegionCount.watchers.append(self)
        _REENTRANT.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        if getattr(self._depth, "n", 0):  # left inside a region (the program's blocks out of order)
            self._depth.n = 0
            _compat.remove_dispatch_mode(self.mode)
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
            _compat.remove_dispatch_mode(self.mode)


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


# Weak: a Function class holds its `forward` and that function's globals (a script's tensors).
_recomputing: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def _recomputes(function: type) -> bool:
    """Whether a Function's backward is a reentrant checkpoint's recompute, by its name (cached)."""
    known = _recomputing.get(function)
    if known is None:
        known = _recomputing[function] = "checkpoint" in function.__name__.lower()
    return known


_REENTRANT = _ReentrantBackward()


__all__ = ["RegionOps"]
