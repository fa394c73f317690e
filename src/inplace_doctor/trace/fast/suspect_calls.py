"""The fast tracer's reads for IPD105 and IPD106 (issue 26): every op, but only inside a call handed a suspect.

Both rules wait for a read of one Python tensor object: the object an
in-place call overwrote (`InplaceCalls.overwritten`, IPD105), or a caller's
tensor an `inplace=True` wrote into (`CallerReads.awaiting`, IPD106). The
deep tracer checks every aten op's arguments against them. The fast one keeps
`InplaceCalls` (a `TorchFunctionMode`: Python sees each torch-level call, not
each op; on the stack only while it has work, `inplace_entry.py`) and, while a
suspect is pending, looks through each call's arguments
for it by identity (nested lists, tuples and dicts too). Only a call that is
handed one runs under a `PerOpMode` (`per_op.py`) making
the deep tracer's checks at each op of that call, in its order, so the read
is the same op with the same line. With no suspect pending, or for a call not
handed one, no op enters Python.

TorchScript functions and methods (a scripted module's `forward`) run their
ops with no torch-level call: their `__call__` is wrapped while the tracer
runs (this thread's calls only), and one handed a suspect runs under the mode
too.

Known limitations: a read the program makes without a call handed the object
(a torch function or scripted code reaching a tensor kept in a closure or an
attribute of an argument) is not seen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ... import _compat
from ..deep.per_op import OpWork, PerOpMode
from ..owner import Busy
from ..process.shared_patches import SharedGroup, SharedPatch
from ..raised.blame import passed_through
from ..reads.caller_reads import CallerReads

#: what runs TorchScript code when Python calls it: a scripted function, a scripted module's method
_SCRIPTED = (torch._C.ScriptFunction, torch._C.ScriptMethod)

#: (func, args, kwargs): reports reads of the objects in-place calls overwrote (`InplaceCalls.check_reads`)
CheckReads = Callable[[Any, Any, Any], None]


class _SuspectWork(OpWork):
    """The deep tracer's IPD105 and IPD106 checks at each forward op, nothing else."""

    def __init__(self, overwritten: dict[int, Any], check_overwritten: CheckReads, caller: CallerReads) -> None:
        self.overwritten = overwritten
        self.check_overwritten = check_overwritten
        self.caller = caller

    def before(self, func: Any, args: Any, kwargs: Any, written: list[torch.Tensor] | None, node: Any) -> Any:
        if self.overwritten:
            self.check_overwritten(func, args, kwargs)  # before the op: the values it reads
        if self.caller.awaiting:
            self.caller.check_reads(func, args, kwargs, written)


class SuspectCalls:
    """Which torch-level calls run under a `PerOpMode` doing `_SuspectWork` (forward ops): those handed an object a read is awaited of."""

    def __init__(self, busy: Busy, overwritten: dict[int, Any], check_overwritten: CheckReads, caller: CallerReads) -> None:
        #: the dicts the deep tracer's checks read (never replaced by their owners): id -> entry
        self.overwritten = overwritten
        self.awaiting = caller.awaiting
        self.mode = PerOpMode(busy, _SuspectWork(overwritten, check_overwritten, caller), forward_only=True)
        self._depth = 0
        #: calls run under the mode (the tests and the report's statistics may read it)
        self.calls = 0
        #: told what a scripted call returned while an overwritten object is followed (`stale_aliases.py`)
        self.returned: Callable[[Any], None] | None = None

    def pending(self) -> bool:
        """Whether a read is awaited at all (then each call's arguments are looked through)."""
        return bool(self.overwritten or self.awaiting)

    def handed(self, args: Any, kwargs: Any) -> bool:
        """Whether a call's arguments hold an awaited object (by id: the exact check is the mode's)."""
        return _holds(args, self.overwritten, self.awaiting, 0) or bool(kwargs) and _holds(
            kwargs.values(), self.overwritten, self.awaiting, 0
        )

    def __enter__(self) -> SuspectCalls:
        _GROUP.acquire(self)
        return self

    def __exit__(self, *exc: object) -> None:
        """The methods PyTorch defined are put back when the last session ends, whichever
        thread's it is (`shared_patches.py`)."""
        _GROUP.release(self)

    def enter(self) -> None:
        """Push the mode for one call (a call nested in it keeps the one already pushed)."""
        self._depth += 1
        if self._depth == 1:
            self.calls += 1
            _compat.push_dispatch_mode(self.mode)

    def leave(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            _compat.remove_dispatch_mode(self.mode)

    @property
    def on(self) -> bool:
        """Whether a call handed a suspect runs now (its ops pass through the mode)."""
        return self._depth > 0


def _holds(values: Any, first: dict[int, Any], second: dict[int, Any], depth: int) -> bool:
    for value in values:
        if isinstance(value, torch.Tensor):
            key = id(value)
            if key in first or key in second:
                return True
        elif depth < 3 and isinstance(value, (list, tuple)):
            if _holds(value, first, second, depth + 1):
                return True
        elif depth < 3 and isinstance(value, dict) and _holds(value.values(), first, second, depth + 1):
            return True
    return False



def _call_seen(cls: Any) -> Callable[[Any], Any]:
    """`cls.__call__` (a scripted callable's): a call handed an object a session of the calling
    thread awaits a read of runs under that session's per-op mode (each session checks its own)."""

    def wrap(original: Any) -> Any:
        def seen(fn: Any, *args: Any, **kwargs: Any) -> Any:
            watched = [  # the latest session's mode pushed first, as its wrapper used to be the outer one
                session for session in reversed(_PATCHES[cls].here())
                if (session.overwritten or session.awaiting) and not session.mode.busy.on
                and session.handed(args, kwargs)
            ]
            for session in watched:
                session.enter()
            try:
                result = original(fn, *args, **kwargs)
            except BaseException as exc:
                passed_through(exc)
                raise
            finally:
                for session in reversed(watched):
                    session.leave()
            for session in _PATCHES[cls].here():  # scripted code makes tensors no torch-level call returns
                if session.overwritten and session.returned is not None:
                    session.returned(result)
            return result

        seen.__wrapped__ = original  # type: ignore[attr-defined]
        return seen

    return wrap


_PATCHES: dict[Any, SharedPatch[SuspectCalls]] = {
    cls: SharedPatch(cls, "__call__", _call_seen(cls)) for cls in _SCRIPTED
}
_GROUP: SharedGroup[SuspectCalls] = SharedGroup(list(_PATCHES.values()))  # made and undone together

__all__ = ["SuspectCalls"]
