"""Threads the traced code starts, which the tracer does not see into.

PyTorch keeps dispatch modes and saved-tensor hooks per thread (the mode stack and the hooks
stack are thread-local state), so a `threading.Thread` started inside `watch()` runs without
the tracer: an in-place error there (PyTorch raises it, the thread catches it) is invisible,
and a report that said nothing about it would read as a clean bill. The tracer is not
installed in those threads: its bookkeeping (the write being settled, the module being
called) is one per tracer, and two threads interleaving in it would name wrong lines.

What is done instead, while the tracer is active: `Thread.start` (the one entry of every
`threading` thread, `concurrent.futures` pools' included) is wrapped, once for all tracers
and put back when the last one exits; a thread started from the traced thread runs under a
small counting mode of its own (one per thread, nothing shared) that counts PyTorch's ops in
it; the report names the threads that ran ops unwatched while the tracer was active (a
thread that outlives it keeps the mode, passing ops through uncounted, until it ends). A
thread whose code enters `watch()` itself is watched (`watched()`), and PyTorch's own
threads (the `DataLoader`'s pin-memory thread) are not the user's. Autograd's worker threads are C++ threads, never started through
`threading`, and are untouched.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..._compat import TorchDispatchMode, pop_dispatch_mode, push_dispatch_mode

_LOCK = threading.Lock()
#: the ident of the thread a `StartedThreads` is active in -> those active there
_ACTIVE: dict[int, list[StartedThreads]] = {}
_ORIGINAL_START: Any = None


@dataclass
class StartedThread:
    """A thread started while traced, and the ops PyTorch ran in it (counted from another thread)."""

    name: str
    ops: int = 0
    watched: bool = False  # its code entered a watch() of its own
    counting: bool = True  # while the tracer that saw it start is active


class _CountOps(TorchDispatchMode):
    """The ops one thread runs; passes each through unchanged. Pushed on that thread's mode stack
    directly, never entered (`__enter__` sets process-wide flags)."""

    def __init__(self, records: list[StartedThread]) -> None:
        super().__init__()
        self.records = records

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        for record in self.records:
            if record.counting:
                record.ops += 1
        return func(*args, **(kwargs or {}))


def _start(thread: threading.Thread, *args: Any, **kwargs: Any) -> Any:
    watchers = _ACTIVE.get(threading.get_ident())
    if not watchers or _torchs_own(thread) or thread.is_alive() or thread.ident is not None:
        return _ORIGINAL_START(thread, *args, **kwargs)  # not ours to count (or a second start, which raises)
    records = [w.started(thread) for w in list(watchers)]
    undo = _count_in(thread, records)
    try:
        return _ORIGINAL_START(thread, *args, **kwargs)
    except BaseException:
        undo()
        for w in list(watchers):
            w.forget(thread)
        raise


def _torchs_own(thread: threading.Thread) -> bool:
    code = getattr(thread, "_target", None) or type(thread).run
    module = getattr(code, "__module__", None) or ""
    return module.split(".")[0] in ("torch", "inplace_doctor")


def _count_in(thread: threading.Thread, records: list[StartedThread]) -> Callable[[], None]:
    """Run `thread`'s `run` under a counting mode of its own; the thread object is as it was after.
    Returns what puts the object back before then (a start that failed)."""
    had = "run" in thread.__dict__
    before = thread.__dict__.get("run")
    run = thread.run

    def undo() -> None:
        if had:
            thread.run = before  # type: ignore[method-assign,assignment]
        else:
            thread.__dict__.pop("run", None)

    @functools.wraps(run)
    def counted() -> Any:
        mode = _CountOps(records)
        push_dispatch_mode(mode)
        try:
            return run()
        finally:
            top = pop_dispatch_mode(None)  # None: the plain stack, no pre-dispatch key
            if top is not mode:  # the thread's code left a mode of its own on the stack: keep it there
                push_dispatch_mode(top)
            undo()

    thread.run = counted  # type: ignore[method-assign,assignment]
    return undo


class StartedThreads:
    """Context manager: threads started from this thread while inside are recorded (`threads`);
    `on_start` is called with each, in the starting thread, before it starts."""

    def __init__(self) -> None:
        self.threads: list[StartedThread] = []
        self.on_start: Callable[[threading.Thread], None] | None = None
        self._by_thread: weakref.WeakKeyDictionary[threading.Thread, StartedThread] = weakref.WeakKeyDictionary()
        self._ident: int | None = None

    def started(self, thread: threading.Thread) -> StartedThread:
        record = StartedThread(thread.name)
        self.threads.append(record)
        self._by_thread[thread] = record
        if self.on_start is not None:
            self.on_start(thread)
        return record

    def forget(self, thread: threading.Thread) -> None:
        """`thread` did not start after all."""
        record = self._by_thread.pop(thread, None)
        if record is not None:
            self.threads.remove(record)

    def watched(self, thread: threading.Thread) -> None:
        """`thread` (one started while this was active) entered a watch() of its own."""
        record = self._by_thread.get(thread)
        if record is not None:
            record.watched = True

    def __enter__(self) -> StartedThreads:
        global _ORIGINAL_START
        self._ident = threading.get_ident()
        with _LOCK:
            if _ORIGINAL_START is None:  # else `_start` is still in the chain (another tool wrapped it after us)
                _ORIGINAL_START = threading.Thread.start
                threading.Thread.start = _start  # type: ignore[method-assign,assignment]
            _ACTIVE.setdefault(self._ident, []).append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        global _ORIGINAL_START
        for record in self.threads:
            record.counting = False
        with _LOCK:
            watchers = _ACTIVE.get(self._ident or 0, [])
            if self in watchers:
                watchers.remove(self)
            if not watchers:
                _ACTIVE.pop(self._ident or 0, None)
            # not if another tool wrapped `start` after us
            if not _ACTIVE and _ORIGINAL_START is not None and threading.Thread.start is _start:
                threading.Thread.start = _ORIGINAL_START  # type: ignore[method-assign,assignment]
                _ORIGINAL_START = None

    def note(self) -> str | None:
        """What the report says about threads that ran PyTorch ops unwatched, if any did."""
        unwatched = [t for t in self.threads if t.ops and not t.watched]
        if not unwatched:
            return None
        names = ", ".join(f"`{t.name}`" for t in unwatched[:3]) + (", ..." if len(unwatched) > 3 else "")
        ops = sum(t.ops for t in unwatched)
        n = len(unwatched)
        return (
            f"{n} thread{'s' if n > 1 else ''} started while watched ({names}) ran {ops} PyTorch op"
            f"{'s' if ops != 1 else ''} unwatched: the tracer is per thread, so in-place errors there (even "
            "ones PyTorch raised and the thread caught) are not in this report; enter `ipd.watch()` in the "
            "thread's function (its findings join this report) or run that code in the main thread"
        )
