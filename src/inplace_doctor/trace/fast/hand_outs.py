"""The fast tracer's hand-outs (issue 26): the Tensor methods that hand memory out of PyTorch, wrapped.

The deep tracer sees `t.numpy()`, `t.__dlpack__()` (what `np.from_dlpack(t)` calls), `t.__array__()`
(what `np.asarray(t)` calls) and `t.data_ptr()` through its `TorchFunctionMode` (`inplace_calls.py`,
`contents.HAND_OUTS`). The fast tracer has no such mode: while it runs, a wrapper stands in place of
each of these methods on `torch.Tensor`; it calls PyTorch's own method and then, as the deep
tracer's mode does once the call returned, reports the hand-out to the `HandOutMethods` of this
context (a context variable, as `write_kernels.py` keeps its recorder: other threads untouched).
`torch.utils.dlpack.to_dlpack` (and `torch.to_dlpack`, the same function), which no mode sees
either, is wrapped here for `ContentChecks` in both tracers (`to_dlpack_patches`): it reports to
the checks entered on the calling thread.

Reported, as in deep mode: calls from Python in the context that entered (nested sessions each see
the call, as nested modes do), outside the tool's own work (`busy`) and outside
`torch._C.DisableTorchFunction()` (which sets the mode aside), and only the outermost of nested
hand-outs (`__array__` calls `numpy`: the mode, which steps aside while it handles a call, sees only
`__array__`). Not reported, in either mode: `t.untyped_storage().data_ptr()`, C++ code's own
pointers, subclasses that override these methods. Each wrapper is a `SharedPatch`: installed by the
first session in, removed by the last out in any order (sessions of several threads), the original
put back (a method `torch.Tensor` only inherits is deleted again).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

import torch

from ..owner import Busy
from ..process.shared_patches import ABSENT, SharedGroup, SharedPatch

#: the Tensor methods that hand memory out: (the method, how findings name it)
METHODS = {"numpy": "`.numpy()`", "__dlpack__": "`__dlpack__()`", "__array__": "`__array__()`", "data_ptr": "`.data_ptr()`"}
#: called with (the tensor, the method, how findings name it) after a hand-out returned
Report = Callable[[Any, str, str], None]
_CURRENT: contextvars.ContextVar[HandOutMethods | None] = contextvars.ContextVar("inplace_doctor_hand_outs", default=None)


class HandOutMethods:
    """Context manager: `report` called after each hand-out (`METHODS`) made in the context that entered."""

    def __init__(self, report: Report, busy: Busy) -> None:
        self.report = report
        self.busy = busy
        self.inside = False  # a hand-out runs: the ones it calls (`__array__`'s `numpy`) are its own
        self.outer: HandOutMethods | None = None  # a session this one is nested in: it sees the calls too
        self._token: contextvars.Token[HandOutMethods | None] | None = None

    def __enter__(self) -> HandOutMethods:
        _GROUP.acquire(self)
        self.outer = _CURRENT.get()
        self._token = _CURRENT.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _CURRENT.reset(self._token)
            self._token = None
            self.outer = None
            _GROUP.release(self)


def _wrapped(original: Any, name: str, how: str) -> Callable[..., Any]:
    get, all_disabled = _CURRENT.get, torch._C._is_torch_function_all_disabled

    def handing_out(t: Any, *args: Any, **kwargs: Any) -> Any:
        calls = get()
        if calls is None or calls.inside or all_disabled():
            return original(t, *args, **kwargs)
        calls.inside = True
        try:
            out = original(t, *args, **kwargs)
        finally:
            calls.inside = False
        while calls is not None:
            if not calls.busy.on:
                calls.report(t, name, how)
            calls = calls.outer
        return out

    handing_out.__name__ = handing_out.__qualname__ = name
    handing_out.__doc__ = getattr(original, "__doc__", None)
    handing_out.__wrapped__ = original  # type: ignore[attr-defined]
    return handing_out


def _patch(name: str, how: str) -> SharedPatch[HandOutMethods]:
    def wrap(own: Any) -> Any:  # a method `torch.Tensor` only inherits is deleted again by the last user
        return _wrapped(getattr(torch.Tensor, name) if own is ABSENT else own, name, how)

    return SharedPatch(torch.Tensor, name, wrap)


#: one wrapper per method, installed while at least one `HandOutMethods` is entered (any thread)
_PATCHES = tuple(_patch(name, how) for name, how in METHODS.items())
_GROUP: SharedGroup[HandOutMethods] = SharedGroup(list(_PATCHES))  # made and undone together


def installed() -> bool:
    """Whether the wrappers are on `torch.Tensor` now."""
    return bool(_PATCHES[0].entries)


def _reporting(original: Any) -> Any:
    """`to_dlpack` that tells the content checks entered on the calling thread (each: nested sessions)."""

    def to_dlpack(tensor: torch.Tensor) -> Any:
        capsule = original(tensor)
        for checks in _DLPACK[0].here():
            checks.handed_out(tensor, "to_dlpack", "`to_dlpack()`")
        return capsule

    to_dlpack.__wrapped__ = original  # type: ignore[attr-defined]
    return to_dlpack


#: users: `ContentChecks` (what has `handed_out(tensor, method, how)`)
_DLPACK: list[SharedPatch[Any]] = []


def to_dlpack_patches() -> list[SharedPatch[Any]]:
    """`torch.utils.dlpack.to_dlpack` and `torch.to_dlpack` (the same function), each wrapped once for
    all sessions and put back by the last (sessions of two threads may end in any order)."""
    if not _DLPACK:
        import torch.utils.dlpack as dlpack

        own = dlpack.to_dlpack  # type: ignore[attr-defined]  # torch binds it from torch._C without re-exporting it
        first: SharedPatch[Any] = SharedPatch(dlpack, "to_dlpack", _reporting)
        _DLPACK.append(first)
        if getattr(torch, "to_dlpack", None) is own:  # the same wrapper: it reports to the first's users
            # its wrapper is the first's current one, not one made from what it wraps: never reused
            _DLPACK.append(SharedPatch(torch, "to_dlpack", lambda original: first.wrapper, reuse=False))
    return _DLPACK


__all__ = ["HandOutMethods", "METHODS", "installed", "to_dlpack_patches"]
