"""`torch.func` transforms that refuse saved-tensor hooks run, while tracing, with ours set aside.

`torch.func.grad`, `vjp`, `jacrev` and `hessian` wrap their work in
`torch.autograd.graph.disable_saved_tensors_hooks(message)`, which raises at
once when any saved-tensor hooks are set: under the tracer, whose hooks are set
for the whole run, a correct program would stop with "torch.func.{grad, vjp,
jacrev, hessian} don't yet support saved tensor hooks". So while the tracer
runs, that function is replaced by one that takes the tracer's hooks off the
stack when they are its top, lets the original disable (and fail, when the
user's own hooks are set, exactly as without the tool), and puts them back on
exit. Inside such a transform, saved tensors are not tracked (PyTorch's own
version check is then on again, as without the tool); `calls` counts the
transforms so the report can say so. One replacement for all tracers, set by
the first in and undone by the last out, in any order (`shared_patches.py`);
it sets aside the hooks of the tracers entered on the calling thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ... import _compat
from .shared_patches import SharedPatch


def _setting_aside(original: Any) -> Any:
    @contextlib.contextmanager
    def disable_saved_tensors_hooks(error_message: str) -> Iterator[None]:
        tracers = {id(t._pack): t for t in _PATCH.here()}
        set_aside: list[FunctionalTransforms] = []
        while tracers:  # nested tracers' hooks, innermost on top: each taken off while it is the top
            top = _compat.top_saved_tensors_hooks(False)
            owner = tracers.pop(id(top[0]), None) if top is not None else None
            if owner is None:
                break
            _compat.pop_saved_tensors_hooks()
            owner.calls += 1
            set_aside.append(owner)
        try:
            with original(error_message):
                yield
        finally:
            for owner in reversed(set_aside):
                _compat.push_saved_tensors_hooks(owner._pack, owner._unpack)

    disable_saved_tensors_hooks.__doc__ = original.__doc__
    disable_saved_tensors_hooks.__wrapped__ = original  # type: ignore[attr-defined]
    return disable_saved_tensors_hooks


_PATCH: SharedPatch[FunctionalTransforms] = SharedPatch(
    torch.autograd.graph, "disable_saved_tensors_hooks", _setting_aside
)


class FunctionalTransforms:
    """Context manager: `torch.func` transforms run inside it with the tracer's hooks `pack`/`unpack` set aside."""

    def __init__(self, pack: Callable[..., Any], unpack: Callable[..., Any]) -> None:
        self._pack = pack
        self._unpack = unpack
        self.calls = 0

    def __enter__(self) -> FunctionalTransforms:
        _PATCH.acquire(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _PATCH.release(self)

    def note(self) -> str | None:
        """The report's line about them, if any ran."""
        if not self.calls:
            return None
        return (
            f"{self.calls} torch.func transform call(s) (grad, vjp, jacrev, hessian) ran with the tool's "
            "saved-tensor hooks set aside, as those transforms require: the tensors they save are checked by "
            "PyTorch alone"
        )
