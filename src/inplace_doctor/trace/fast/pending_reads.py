"""The fast tracer's reads, only while one is awaited (issue 26): IPD107's stale `state_dict()` aliases,
IPD110's graph tensors changed outside autograd.

The fast tracer sees no op but writes. A rule that waits for a *read* (a
stale alias used as a snapshot) needs every op only while such a suspect is
pending: `PendingReads` pushes a pass-through dispatch mode on this thread's
stack when a write leaves a held alias stale or changes a graph tensor
autograd does not see changed, and pops it at the first write kernel after
none is pending any more (the stale alias was used or freed; the changed
graph tensor's use was found and its node hooked, or the tensor freed).
`.detach()` and `.data`, which IPD110 needs to know always (a write through
such an alias is the change), are seen by wrapping `Tensor.detach` and
`Tensor.data` while the tracer runs (calls from Python only).
A write under `torch.inference_mode()` into a graph tensor (IPD110) reaches the
write kernels like any other, but the mode it turns on would be lost when the
block ends: the inference-mode guard puts this thread's dispatch keys back as
they were when the block began, so a mode pushed inside stays on the stack and
is never called again. While a tracer runs, `torch.inference_mode.__exit__`
is wrapped to switch the keys back on when one of the tool's modes is on the
stack (a block that never pushed one pays one Python call at its end), and the
mode is not popped inside such a block (the first write after it does).
Between those points every op enters Python, as in deep mode; elsewhere none
does.

Known limitations: the mode is pushed and popped only while it is the top of
the thread's dispatch-mode stack (a mode the program entered after it stays
above it until the program leaves that mode); a stale alias kept for the
rest of the run keeps the mode on for the rest of the run. An inference-mode
guard not entered through `torch.inference_mode` (`torch._C._InferenceMode`
used directly, C++ code) is not seen: a graph tensor written inside one is
missed. A dispatch mode the program itself pushed inside such a block and
left on after it is called again after it when the tool's mode was pushed in
the same block (without the tool it would not be).
"""

from __future__ import annotations

from typing import Any

import torch

from ... import _compat
from ..deep.per_op import OpWork, PerOpMode
from ..owner import Busy
from ..process.shared_patches import SharedGroup, SharedPatch
from ..reads.aliases import HeldTensors
from ..reads.graph_writes import UnrecordedWrites


class _ReadWork(OpWork):
    """What the deep tracer's mode does for IPD107 and IPD110, in its order: each op's tensor
    arguments checked against the stale aliases and the changed graph tensors."""

    def __init__(self, held: HeldTensors, graph: UnrecordedWrites) -> None:
        self.held = held
        self.graph = graph

    def before(self, func: Any, args: Any, kwargs: Any, written: list[torch.Tensor] | None, node: Any) -> Any:
        graph = self.graph
        if graph.awaiting:
            graph.resolve()
        stale_read = self.held.check_uses(func, args, kwargs, written) if self.held.stale_ids else None
        if graph.watching and node is None and func is not _DETACH:
            graph.check_uses(func, args, kwargs, written)
        return stale_read

    def after(
        self, stale_read: Any, func: Any, args: Any, kwargs: Any, out: Any, written: list[torch.Tensor] | None,
        batch_norm: bool, node: Any,
    ) -> None:
        if stale_read is not None:  # a `.detach()`/`.data` of a stale alias: the same alias, followed
            self.held.alias_of_stale(stale_read, out)
        if self.graph.used is not None:
            self.graph.after_op(out)


_DETACH = torch.ops.aten.detach.default
_INFERENCE_MODE = torch.autograd.grad_mode.inference_mode
#: PyTorch's `inference_mode.__exit__`, which the wrapper calls first
_TORCH_INFERENCE_EXIT = _INFERENCE_MODE.__dict__["__exit__"]
_PYTHON_KEYS = (torch._C.DispatchKey.Python, torch._C.DispatchKey.PythonTLSSnapshot)
_TENSOR_DATA = torch._C.TensorBase.__dict__["data"]


def _detach_seen(original: Any) -> Any:
    """`Tensor.detach`, telling the sessions of the calling thread what was detached."""

    def detach(t: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        sessions = _DETACH_PATCH.here()
        if not any(reads.busy.on for reads in sessions):  # one session's own detach is no session's
            for reads in sessions:
                reads.graph.detached(t)
        return original(t, *args, **kwargs)  # type: ignore[no-any-return]

    detach.__wrapped__ = original  # type: ignore[attr-defined]
    return detach


def _data_seen(_inherited: Any) -> Any:
    """`Tensor.data` (inherited from `TensorBase`: set on `Tensor` while a session runs, deleted
    after), telling the sessions of the calling thread likewise. Setting `.data` is PyTorch's."""

    def data(t: torch.Tensor) -> torch.Tensor:
        sessions = _DATA_PATCH.here()
        if not any(reads.busy.on for reads in sessions):  # one session's own detach is no session's
            for reads in sessions:
                reads.graph.detached(t)
        return _TENSOR_DATA.__get__(t)  # type: ignore[no-any-return]

    return property(data, _TENSOR_DATA.__set__)


def _inference_mode_exit(self: Any, *exc: Any) -> None:
    """`torch.inference_mode`'s end, then the Python dispatch keys on again if the guard's
    restore switched them off under a mode of the tool's (pushed inside the block)."""
    _TORCH_INFERENCE_EXIT(self, *exc)
    length = torch._C._len_torch_dispatch_stack()
    if not length or torch._C._dispatch_tls_is_dispatch_key_included(_PYTHON_KEYS[0]):
        return
    if any(isinstance(torch._C._get_dispatch_stack_at(i), PerOpMode) for i in range(length)):
        for key in _PYTHON_KEYS:  # what pushing onto an empty stack does
            torch._C._dispatch_tls_set_dispatch_key_included(key, True)


class PendingReads:
    """Turns a `PerOpMode` doing `_ReadWork` on while a stale held alias awaits its use, off once none does."""

    def __init__(self, busy: Busy, held: HeldTensors, graph: UnrecordedWrites) -> None:
        self.held = held
        self.graph = graph
        self.busy = busy
        self.mode = PerOpMode(busy, _ReadWork(held, graph))
        self._originals: dict[str, Any] = {}
        self.on = False
        #: times the mode was turned on (the report's statistics may show it)
        self.turned_on = 0

    def pending(self) -> bool:
        """Whether a live stale alias awaits its use (freed ones are dropped here)."""
        stale = self.held.stale_ids
        if stale and any(e.ref() is None for e in stale.values()):
            for key in [k for k, e in stale.items() if e.ref() is None]:
                del stale[key]
        graph = self.graph
        if graph.watching:
            graph.watching = [w for w in graph.watching if w.root() is not None]
        return bool(stale or graph.watching or graph.awaiting or graph.used is not None)

    def asked(self) -> bool:
        """Cheap: whether `update` may have anything to do."""
        graph = self.graph
        return self.on or bool(self.held.stale_ids or graph.watching or graph.awaiting)

    def __enter__(self) -> PendingReads:
        _GROUP.acquire(self)
        return self

    def __exit__(self, *exc: object) -> None:
        """PyTorch's `detach`, `.data` and `inference_mode.__exit__` are put back when the last
        session ends, whichever thread's it is (`shared_patches.py`)."""
        self.off()
        if self.on:  # a mode the program pushed after it is still above it: lifted off, put back
            _compat.remove_dispatch_mode(self.mode)
            self.on = False
        _GROUP.release(self)

    def update(self) -> None:
        """Called by the write kernels' hooks: the mode on when a read is awaited, off when none is.

        Not inside backward: autograd restores the thread's dispatch-mode stack as it was when
        `backward()` was called once backward ends, which would undo a push or a pop made there."""
        if _compat.current_autograd_node() is not None:
            return
        wanted = self.pending()
        if wanted == self.on:
            return
        if wanted:
            _compat.push_dispatch_mode(self.mode)
            self.on = True
            self.turned_on += 1
        else:
            self.off()

    def off(self) -> None:
        """Pop the mode, if it is the top of this thread's stack (else it stays until it is); not
        inside `torch.inference_mode`, whose end would switch the Python keys back on over an empty stack."""
        if (
            self.on
            and _top_mode() is self.mode
            and _compat.current_autograd_node() is None
            and not torch.is_inference_mode_enabled()
        ):
            _compat.pop_dispatch_mode(None)
            self.on = False


def _top_mode() -> Any:
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode()


_DETACH_PATCH: SharedPatch[PendingReads] = SharedPatch(torch.Tensor, "detach", _detach_seen)
_DATA_PATCH: SharedPatch[PendingReads] = SharedPatch(torch.Tensor, "data", _data_seen)
_EXIT_PATCH: SharedPatch[PendingReads] = SharedPatch(
    _INFERENCE_MODE, "__exit__", lambda _torchs: _inference_mode_exit
)
_PATCHES = (_DETACH_PATCH, _DATA_PATCH, _EXIT_PATCH)
_GROUP: SharedGroup[PendingReads] = SharedGroup(list(_PATCHES))  # made and undone together


__all__ = ["PendingReads"]

