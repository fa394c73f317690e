"""The fast tracer's hand-outs (issue 26): the Tensor methods that hand memory out of PyTorch, wrapped.

The deep tracer sees `t.numpy()`, `t.__dlpack__()` (what `np.from_dlpack(t)` calls), `t.__array__()`
(what `np.asarray(t)` calls) and `t.data_ptr()` through its `TorchFunctionMode`
(`inplace_calls.py`, `contents.HAND_OUTS`). The fast tracer has no such mode: while it runs,
`HandOutMethods` puts a wrapper in place of each of these methods on `torch.Tensor` (as
`pending_reads.py` wraps `Tensor.detach`), which calls PyTorch's own method and then reports the
hand-out, as the deep tracer's mode does once the call returned. `torch.utils.dlpack.to_dlpack`, a
module function no mode sees either, is patched by `ContentChecks` itself in both tracers.

What is reported, as in deep mode: calls from Python on the thread that entered (the mode is per
thread), outside the tool's own work (`busy`) and outside `torch._C.DisableTorchFunction()` (which
sets the mode aside), and only the outermost of nested hand-outs (`__array__` calls `numpy`: the
mode, which steps aside while it handles a call, sees only `__array__`). Not reported, in either mode: `t.untyped_storage().data_ptr()`, C++ code's own
pointers, and subclasses that override these methods. The wrappers are removed on exit, the
originals put back (methods `torch.Tensor` only inherits are deleted again).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch

from .owner import Busy

#: the Tensor methods that hand memory out: (the method, how findings name it)
METHODS = {"numpy": "`.numpy()`", "__dlpack__": "`__dlpack__()`", "__array__": "`__array__()`", "data_ptr": "`.data_ptr()`"}
#: called with (the tensor, the method, how findings name it) after a hand-out returned
Report = Callable[[Any, str, str], None]
_INHERITED = object()  # a method `torch.Tensor` had only from `TensorBase`: deleted again on exit


class HandOutMethods:
    """Context manager: `METHODS` wrapped on `torch.Tensor`, `report` called after each hand-out."""

    def __init__(self, report: Report, busy: Busy) -> None:
        self.report = report
        self.busy = busy
        self.inside = False  # a hand-out runs: the ones it calls (`__array__`'s `numpy`) are its own
        self._thread = 0
        self._originals: list[tuple[str, Any]] = []

    def __enter__(self) -> "HandOutMethods":
        self._thread = threading.get_ident()
        for name, how in METHODS.items():
            own = torch.Tensor.__dict__.get(name, _INHERITED)
            self._originals.append((name, own))
            setattr(torch.Tensor, name, self._wrapped(getattr(torch.Tensor, name), name, how))
        return self

    def __exit__(self, *exc: object) -> None:
        while self._originals:
            name, own = self._originals.pop()
            if own is _INHERITED:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, own)

    def _wrapped(self, original: Any, name: str, how: str) -> Callable[..., Any]:
        calls, busy, get_ident, thread = self, self.busy, threading.get_ident, self._thread
        all_disabled = torch._C._is_torch_function_all_disabled

        def handing_out(t: Any, *args: Any, **kwargs: Any) -> Any:
            if calls.inside or busy.on or get_ident() != thread or all_disabled():
                return original(t, *args, **kwargs)
            calls.inside = True
            try:
                out = original(t, *args, **kwargs)
            finally:
                calls.inside = False
            calls.report(t, name, how)
            return out

        handing_out.__name__ = handing_out.__qualname__ = name
        handing_out.__doc__ = getattr(original, "__doc__", None)
        handing_out.__wrapped__ = original  # type: ignore[attr-defined]
        return handing_out


__all__ = ["HandOutMethods", "METHODS"]
