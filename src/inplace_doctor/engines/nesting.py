"""Which `watch()` session a block of code runs under, and how a nested session's findings reach it.

A `watch()` entered while another is active in the same thread (a script's own `ipd.watch()`
under `inplace-doctor run`, or one `with ipd.watch()` inside another) runs as if alone: its
findings, its report and its `InplaceError` are its own. The enclosing session adopts it when
it ends: the enclosing session's `findings` and `report()` also hold the nested session's
findings, as a live view, so a finding the nested session confirms later (a backward after
its block reaching a tensor it saw overwritten) is there too.

Who owns what: a tensor saved inside the nested block is the nested session's (the innermost
saved-tensor hooks are the ones PyTorch calls), so a write to it is the nested session's
finding; a write inside the block to a tensor saved outside it is the enclosing session's.
Where both see the same cause (an `inplace=True` call, a PyTorch error raised at the op), the
enclosing report holds it once: one finding per cause (`Finding.dedupe_key`), the confirmed
one where one of them confirmed it, else the enclosing session's own.

A thread started while a session is active (`threading.Thread.start`, seen by the tracer)
inherits it: a `watch()` entered in that thread reports to it as a nested one does.
"""

from __future__ import annotations

import threading
import weakref
from typing import Protocol

from ..findings import Finding


class Session(Protocol):
    def adopt_session(self, findings: list[Finding], adopted: list[list[Finding]]) -> None: ...

    def thread_watched(self, thread: threading.Thread) -> None: ...


_LOCAL = threading.local()
#: thread -> the session active where it was started (weak: a finished thread is forgotten)
_INHERITED: weakref.WeakKeyDictionary[threading.Thread, Session] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _stack() -> list[Session]:
    stack: list[Session] | None = getattr(_LOCAL, "stack", None)
    if stack is None:
        stack = _LOCAL.stack = []
    return stack


def enter(session: Session) -> tuple[Session | None, list[Session]]:
    """`session` starts in this thread: the session it reports to (None for the outermost) and
    the stack to `leave` it from."""
    stack = _stack()
    if stack:
        parent: Session | None = stack[-1]
    else:
        with _LOCK:
            parent = _INHERITED.get(threading.current_thread())
        if parent is not None:
            parent.thread_watched(threading.current_thread())
    stack.append(session)
    return parent, stack


def leave(session: Session, stack: list[Session]) -> None:
    """`session` ended (not necessarily the innermost: `run --steps` ends its own window inside a
    script's block)."""
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is session:
            del stack[i]
            return


def started_thread(thread: threading.Thread) -> None:
    """A thread started in this thread: a session entered in it reports to the innermost
    session active here."""
    stack = _stack()
    if stack:
        with _LOCK:
            _INHERITED[thread] = stack[-1]


def merged(own: list[Finding], adopted: list[list[Finding]]) -> list[Finding]:
    """A session's own findings and those of the sessions it adopted, one per cause."""
    if not adopted:
        return list(own)
    out = list(own)
    index = {f.dedupe_key: i for i, f in enumerate(out)}
    for findings in adopted:
        for f in list(findings):
            i = index.get(f.dedupe_key)
            if i is None:
                index[f.dedupe_key] = len(out)
                out.append(f)
            elif f.confirmed and not out[i].confirmed:
                out[i] = f
    return out
