"""The fast tracer's view of in-place calls PyTorch refuses at the call, caught by the program or not.

Autograd refuses some in-place calls before any kernel runs (a leaf that
requires grad, a view of one, one of several views `unbind` returned, a view
made under `no_grad`, a custom Function's output): no write kernel sees them,
and a training loop that catches `RuntimeError` (skip the batch, retry, log and
go on) leaves no trace of them at all. The deep tracer's function mode sees
every such call; the fast one has no mode on the stack, so while one of its
sessions runs, the in-place methods of `torch.Tensor` (`add_`, `relu_`, ...,
`__setitem__`) are wrapped: a call that raises is noted, from the live stack,
to the sessions of the calling thread (`RaisedErrors.note`), and the error goes
on to the program unchanged (its type, message and traceback but for the
wrapper's frame). Each session reports the noted errors that never left its
code as caught. A call that does not raise pays one Python call.

`x += y` goes through the augmented methods `inplace_entry.py` wraps, which
note to the same sessions (`note_raised`).

Known limitations: a call made from C++ (an in-place op inside another op, a
TorchScript function) is not seen; nor an in-place method of a Tensor subclass
that defines its own; nor `torch.add(..., out=x)` and other functions' `out=`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..process.shared_patches import ABSENT, SharedGroup, SharedPatch
from .blame import passed_through

#: methods whose name ends in `_` but change no tensor's values (or are the tool's own concern)
_NOT_WRITES = frozenset({"requires_grad_", "share_memory_", "detach_", "retain_grad_", "record_stream_"})
#: the augmented methods (`__iadd__`): `inplace_entry.py` wraps them and calls `note_raised`
METHODS = sorted(
    name for name in dir(torch.Tensor)
    if (name.endswith("_") and not name.startswith("_") and name not in _NOT_WRITES) or name == "__setitem__"
)


class RaisedCalls:
    """One session's notes of refused in-place calls: `note(exc, op, target)` for each (enter/exit)."""

    def __init__(self, note: Callable[[BaseException, str, Any], None]) -> None:
        self.note = note

    def __enter__(self) -> RaisedCalls:
        _GROUP.acquire(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _GROUP.release(self)


def note_raised(exc: BaseException, op: str, target: Any) -> None:
    """Tell the sessions of the calling thread that in-place call `op` on `target` raised `exc`."""
    if isinstance(exc, RuntimeError):
        for session in _GROUP.here():
            session.note(exc, op, target)


def _method_patch(name: str) -> SharedPatch[RaisedCalls]:
    op = f"aten.{name}"

    def wrap(original: Any) -> Any:
        if original is ABSENT:  # inherited from `TensorBase`: deleted again after
            original = getattr(torch.Tensor, name)

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return original(self, *args, **kwargs)
            except BaseException as exc:
                passed_through(exc)
                if isinstance(exc, RuntimeError):
                    for session in patch.here():
                        session.note(exc, op, self)
                raise

        method.__wrapped__ = original  # type: ignore[attr-defined]
        method.__name__, method.__qualname__, method.__module__ = name, f"Tensor.{name}", torch.Tensor.__module__
        return method

    patch: SharedPatch[RaisedCalls] = SharedPatch(torch.Tensor, name, wrap)
    return patch


_GROUP: SharedGroup[RaisedCalls] = SharedGroup([_method_patch(name) for name in METHODS])

__all__ = ["RaisedCalls", "note_raised"]
