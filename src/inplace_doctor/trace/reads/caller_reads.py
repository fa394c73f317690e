"""Writes a call was asked to make into its caller's tensor: reported only if the caller reads it afterwards.

A module constructed with `inplace=True` (`transforms.Normalize(mean, std,
inplace=True)` in a data pipeline, a first-layer `nn.ReLU(inplace=True)`), or
a call given `inplace=True` (`F.relu(x, inplace=True)`), writes the tensor it
is given because it was asked to. That is a hazard
only when the caller still holds that tensor and reads it after the call: a
tensor `ToTensor()` has just made, or `model(x.clone())`'s temporary, is read
by no one. So such a write waits, weakly, for the end of the outermost call:
if the call returned the caller's tensor itself (the write *is* the result: a read
of it is a read of the result), or the caller dropped the tensor, nothing is
reported; otherwise the first forward op
that reads the caller's very tensor object after the call reports it, with
that op's line. Writes no flag asked for (`x += b`, `x.clamp_()`,
`x[mask] = 0` inside a model's forward) are reported at once, elsewhere.

Not seen: reads through a view the caller made before the call (only its own
tensor object counts), and reads after the watched code ends.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from ...events import CallerInputWritten, Event, WriteInfo
from ..ops import op_name
from ..places.modules import ModulePaths
from ..places.stacks import capture_frames, make_site

# A first op that only overwrites the caller's tensor (refilling a reused batch buffer) reads nothing.
_OVERWRITES = frozenset({"aten.copy_", "aten.fill_", "aten.zero_", "aten.set_", "aten.resize_"})


class _Asked:
    __slots__ = ("ref", "argument", "writes")

    def __init__(self, ref: weakref.ref[torch.Tensor], argument: str) -> None:
        self.ref = ref
        self.argument = argument
        self.writes: list[WriteInfo] = []


class CallerReads:
    """Asked-for writes into the caller's tensors: held during the call, then until the caller reads them."""

    def __init__(self, emit: Callable[[Event], None], modules: ModulePaths) -> None:
        self._emit = emit
        self._modules = modules
        self._during: dict[int, _Asked] = {}  # id(caller's tensor) -> its asked-for writes, this call
        #: id(caller's tensor) -> asked-for writes of a call that returned; the dispatch mode holds
        #: this very dict (never replaced) and checks each forward op against it while it is not empty
        self.awaiting: dict[int, _Asked] = {}

    def asked(self, info: WriteInfo, argument: str, tensor: torch.Tensor) -> None:
        """A write an `inplace=True` asked for (module flag or call argument), into the caller's `tensor`."""
        entry = self._during.get(id(tensor))
        if entry is None or entry.ref() is not tensor:
            entry = self._during[id(tensor)] = _Asked(weakref.ref(tensor), argument)
        entry.writes.append(info)

    def call_started(self) -> None:
        self._during = {}  # a call that raised never returned: its writes are the error's story

    def call_returned(self, output: Any) -> None:
        """The outermost call returned `output`: what it wrote and did not return waits for a read."""
        during, self._during = self._during, {}
        returned = {id(t) for t in _tensors(output)}
        for key, entry in during.items():
            tensor = entry.ref()
            if tensor is None or key in returned:
                continue  # the caller dropped it, or got that very tensor back as the result
            entry.ref = weakref.ref(tensor, self._forget(key))
            self.awaiting[key] = entry

    def _forget(self, key: int) -> Callable[[Any], None]:
        def forget(ref: Any) -> None:
            entry = self.awaiting.get(key)
            if entry is not None and entry.ref is ref:
                del self.awaiting[key]

        return forget

    def check_reads(self, func: Any, args: Any, kwargs: Any, written: list[torch.Tensor] | None) -> None:
        """Before a forward op: report the asked-for writes into each caller's tensor the op reads."""
        for value in (*args, *kwargs.values()):
            for item in value if isinstance(value, (list, tuple)) else (value,):
                if not isinstance(item, torch.Tensor):
                    continue
                entry = self.awaiting.get(id(item))
                if entry is None or entry.ref() is not item:
                    continue
                del self.awaiting[id(item)]
                name = op_name(func)
                if name in _OVERWRITES and written and any(w is item for w in written):
                    continue  # refilled before any read
                frames, api = capture_frames()
                read = make_site(name, frames, api, self._modules.current, "forward")
                for info in entry.writes:
                    self._emit(CallerInputWritten(info, entry.argument, read))

    def clear(self) -> None:
        self._during = {}
        self.awaiting.clear()


def _tensors(output: Any) -> list[torch.Tensor]:
    """The tensors a call returned: itself, or the items of a tuple, list or dict it returned."""
    if isinstance(output, torch.Tensor):
        return [output]
    items = output.values() if isinstance(output, dict) else output if isinstance(output, (list, tuple)) else ()
    return [t for t in items if isinstance(t, torch.Tensor)]
