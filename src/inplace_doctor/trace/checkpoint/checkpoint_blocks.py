"""A non-reentrant checkpoint region's blocks, counted and watched while a tracer runs.

`torch.utils.checkpoint` (non-reentrant) runs a region's forward inside a
`with _checkpoint_hook(frame)` block and each recompute inside a
`with _recomputation_hook(frame_ref, gid)` block: the saved-tensor hooks that
pack the region's saves. While at least one tracer runs, `RegionCount` wraps
both classes' `__enter__`/`__exit__` (process-wide; undone when the last
tracer leaves) to count the blocks open, tell the recompute checks when a
recompute ends (`recompute.RecomputeCheck.recompute_ended`) and let the fast
tracer turn its per-op mode on inside them (`checkpoint_ops.RegionOps`).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from ... import _compat


class RegionCount:
    """How many non-reentrant checkpoint hooks are open (any thread): checkpoint's hook classes count
    their `with` blocks while at least one tracer runs. Undone when the last one leaves."""

    n = 0
    _users = 0
    _lock = threading.Lock()  # tracers of several threads enter and leave
    _saved: list[tuple[type, Any, Any]] = []
    #: the RecomputeChecks told when a recompute ends (`RecomputeCheck.recompute_ended`)
    listeners: weakref.WeakSet[Any] = weakref.WeakSet()
    #: the fast tracers' per-op interception, asked at each block's start (`checkpoint_ops.RegionOps`)
    watchers: list[Any] = []

    @classmethod
    def watcher_for(cls, outer_hooks: Any) -> Any:
        """The watcher that takes a region's block starting on this thread (`outer_hooks`: the
        saved-tensor hooks around it), its per-op interception on from now; None if none does."""
        for watcher in list(cls.watchers):
            if watcher.region_entered(outer_hooks):
                return watcher
        return None

    def __enter__(self) -> RegionCount:
        cls = type(self)
        with cls._lock:
            cls._users += 1
            if cls._users == 1:
                cls._install()
        return self

    @classmethod
    def _install(cls) -> None:
        for hook_class in _compat.CHECKPOINT_HOOK_CLASSES:
            cls._saved.append((hook_class, hook_class.__dict__.get("__enter__"), hook_class.__dict__.get("__exit__")))
            _count_blocks(hook_class, hook_class is _compat.CHECKPOINT_HOOK_CLASSES[1])

    def __exit__(self, *exc: object) -> None:
        cls = type(self)
        with cls._lock:
            cls._users -= 1
            if cls._users > 0:
                return
            for hook_class, enter, exit_ in cls._saved:
                for name, original in (("__enter__", enter), ("__exit__", exit_)):
                    if original is None:
                        delattr(hook_class, name)
                    else:
                        setattr(hook_class, name, original)
            cls._saved = []
            cls.n = 0


def open_region(own_pack: Any) -> tuple[Any, Any] | None:
    """The non-reentrant checkpoint region this thread's op runs in (its frame, forward or
    recompute), read from the saved-tensor hooks on top; None outside one. `own_pack`: the
    tracer's own pack hook, on top of the hooks outside checkpoint regions."""
    hooks = _compat.top_saved_tensors_hooks(False)
    if hooks is None or hooks[0] is own_pack:
        return None
    return _compat.checkpoint_region(hooks[0])


def _count_blocks(hook_class: type, recompute: bool) -> None:
    enter, exit_ = hook_class.__enter__, hook_class.__exit__  # type: ignore[attr-defined]

    def __enter__(self: Any) -> Any:
        outer = _compat.top_saved_tensors_hooks(False) if RegionCount.watchers else None  # before the block's own
        out = enter(self)
        RegionCount.n += 1
        self._inplace_doctor_counted = True
        watcher = RegionCount.watcher_for(outer) if RegionCount.watchers else None
        if watcher is not None:
            self._inplace_doctor_watcher = watcher
        return out

    def __exit__(self: Any, *exc: object) -> Any:
        watcher = self.__dict__.pop("_inplace_doctor_watcher", None)
        if watcher is not None:
            watcher.region_exited()
        if self.__dict__.pop("_inplace_doctor_counted", False):
            RegionCount.n = max(0, RegionCount.n - 1)
        out = exit_(self, *exc)
        if recompute and RegionCount.listeners:
            region = _compat.checkpoint_region(self.pack_hook)
            if region is not None:
                for listener in list(RegionCount.listeners):
                    listener.recompute_ended(*region)
        return out

    hook_class.__enter__ = __enter__  # type: ignore[attr-defined]
    hook_class.__exit__ = __exit__  # type: ignore[attr-defined]


__all__ = ["RegionCount", "open_region"]
