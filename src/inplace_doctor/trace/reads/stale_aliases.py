"""IPD105 through another object: a view or `detach()` of what an `inplace=True` call overwrote,
made before the call and read after it.

`InplaceCalls` follows the object a call overwrote by identity. Another object
over the same memory made before the call (`kept = h[:, :4]`, `h.detach()`)
reads the new values too, where the out-of-place program reads the old ones.
While an overwritten object is followed, every torch-level call of the program
passes through `InplaceCalls` (its function mode is on the stack): a tensor
such a call returns over an overwritten memory is recorded as made after the
latest write there (`StaleAliases.made`). A tensor argument over that memory,
sharing an element with the written tensor and made before the write (never
recorded, or recorded before it), is a stale alias. A call reading it reports
the read as IPD105 does; a call reading only its metadata (`size()`, `.shape`)
or making another view of it (which then is stale in turn) reads nothing.

Only for `inplace=True` calls, whose one purpose is to save memory: an
augmented assignment (`x += y` on a view of a buffer) may update memory other
objects read on purpose.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import torch

from ... import _compat
from ...causes import WriteForm
from ...events import WriteInfo
from ..places.modules import ModuleContext
from ..places.stacks import MAX_STACK, TORCH_DIR, make_site, resolve_stack
from ..places.user_files import is_tool_file
from ..saves.storage import elements_overlap, last_element, storage_key, storage_span
from .value_change import finite

_Parameter = torch.nn.Parameter
#: calls that read no value of the tensors they are handed, only their metadata
_METADATA = frozenset({
    "size", "dim", "stride", "numel", "nelement", "element_size", "storage_offset", "is_contiguous", "data_ptr",
    "untyped_storage", "storage", "__len__", "__get__", "__set__", "requires_grad_", "retain_grad", "register_hook",
    "is_floating_point", "is_complex", "is_signed", "get_device", "is_set_to", "__hash__", "__format__", "_is_view",
    "is_inference", "is_pinned", "is_shared", "is_coalesced", "has_names", "ndimension", "type", "_version",
})
#: calls that write their first argument without reading it; the first three write all of it
_OVERWRITES = frozenset({"copy_", "fill_", "zero_", "set_", "resize_", "__setitem__"})
_WHOLLY = frozenset({"copy_", "fill_", "zero_"})
#: `kept += 1`: Python's augmented operators, which read what they update
_AUGMENTED = frozenset({
    "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__", "__iand__",
    "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__",
})
_EXACT_LIMIT = 1 << 24  # elements between the two tensors' first and last: above it, the write's largest change


_FORMS = {"flag": WriteForm.FLAG, "augmented": WriteForm.AUGMENTED}


class Overwritten:
    """An object an in-place call overwrote, with its value from before (or the largest change made).

    Where the call ran is kept as a captured stack, resolved only if a read is reported. `serial`
    numbers the write, `storage` is its memory's key where stale aliases are looked for (0: not).
    """

    __slots__ = (
        "ref", "snapshot", "change", "op", "stack", "module", "shape", "dtype", "kind", "find_origin", "serial",
        "storage",
    )

    def __init__(
        self, ref: Any, snapshot: torch.Tensor | None, change: float | None, op: str, stack: Any,
        module: ModuleContext | None, target: torch.Tensor, kind: str, origin: Any = None,
    ) -> None:
        self.ref = ref
        self.snapshot = snapshot
        self.change = change
        self.op = op
        self.stack = stack
        self.module = module
        self.shape = tuple(target.shape)
        self.dtype = str(target.dtype).removeprefix("torch.")
        self.kind = kind
        self.find_origin = origin  # the module's construction line, looked up only when a read is reported
        self.serial = 0
        self.storage = 0

    def write(self) -> WriteInfo:
        frames, api, _ = resolve_stack(self.stack, MAX_STACK)
        origin = self.find_origin(tuple({f[0] for f in frames})) if self.find_origin is not None else None
        return WriteInfo(
            site=make_site(self.op, frames, api, self.module, "forward", origin, _FORMS[self.kind]),
            shape=self.shape,
            dtype=self.dtype,
            writes_bytes=True,
        )


def tensors_in(args: Any, kwargs: Any) -> list[torch.Tensor]:
    """The tensors among a call's arguments, and in its lists and tuples (one level down)."""
    found: list[torch.Tensor] = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(item for item in value if isinstance(item, torch.Tensor))
    return found


class StaleAliases:
    """The tensors made while overwritten memory is followed, by the write they came after."""

    def __init__(self) -> None:
        self.serial = 0  # the latest write's number
        self._made: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}
        self._followed: tuple[tuple[int, int], frozenset[int]] = ((0, 0), frozenset())

    def followed(self, overwritten: dict[int, Overwritten]) -> frozenset[int]:
        """The storage keys of the memory `inplace=True` calls overwrote that is followed now (kept
        until a write is added or an entry goes: every call of the program asks while any is)."""
        marker = (self.serial, len(overwritten))
        if self._followed[0] != marker:
            self._followed = (marker, frozenset(e.storage for e in overwritten.values() if e.storage))
        return self._followed[1]

    def written(self, entry: Overwritten, target: torch.Tensor, alias: torch.Tensor) -> None:
        """A new `_Overwritten` entry: its write's number and memory; the alias handed back is made after it."""
        self.serial += 1
        entry.serial = self.serial
        span = storage_span(target) if entry.kind == "flag" else None
        entry.storage = span[0] if span is not None else 0
        self._note(alias)

    def _note(self, t: torch.Tensor) -> None:
        if len(self._made) > 4096:
            self._made = {k: v for k, v in self._made.items() if v[0]() is not None}
        self._made[id(t)] = (weakref.ref(t), self.serial)

    def _made_after(self, t: torch.Tensor) -> int:
        made = self._made.get(id(t))
        return made[1] if made is not None and made[0]() is t else 0

    def found(self, overwritten: dict[int, Overwritten], args: Any, kwargs: Any) -> list[tuple[Overwritten, torch.Tensor]]:
        """(entry, tensor) for each argument that is a stale alias of an overwritten tensor."""
        storages = self.followed(overwritten)
        if not storages:
            return []
        stale: list[tuple[Overwritten, torch.Tensor]] = []
        for t in tensors_in(args, kwargs):
            if type(t) is _Parameter or id(t) in overwritten:  # the object itself: `InplaceCalls._check`
                continue
            if storage_key(t) not in storages:
                continue
            span = storage_span(t)
            if span is None:
                continue
            entries = [e for e in overwritten.values() if e.storage == span[0]]
            after = self._made_after(t)
            for entry in sorted(entries, key=lambda e: -e.serial):  # the latest write it came before
                target = entry.ref()
                if after >= entry.serial or target is None:
                    continue
                written = storage_span(target)
                if written is not None and written[1] < span[2] and span[1] < written[2] and elements_overlap(target, t):
                    stale.append((entry, t))
                    break
        return stale

    def made(
        self, func: Any, args: Any, out: Any, overwritten: dict[int, Overwritten], stale: list[tuple[Overwritten, torch.Tensor]]
    ) -> None:
        """After a call: the tensors it returned over followed memory are made now, unless they view
        a stale alias it was handed (`kept.view(-1)` is as stale as `kept`)."""
        storages = self.followed(overwritten)
        if not storages:
            return
        if stale and getattr(func, "__name__", "") in _WHOLLY and args and any(t is args[0] for _, t in stale):
            self._note(args[0])  # `kept.fill_(0)`, `kept.copy_(v)`: what it holds now is written after the write
        tainted = {storage_key(t) for _, t in stale}
        for t in (out if isinstance(out, (list, tuple)) else (out,)):
            if isinstance(t, torch.Tensor) and self._made_after(t) == 0:
                key = storage_key(t)
                if key in storages and key not in tainted:
                    self._note(t)

    def clear(self) -> None:
        self._made.clear()
        self._followed = ((0, 0), frozenset())


def called_by_the_tool(depth: int, entries: set[Any]) -> bool:
    """Whether the call being handled `depth` frames up came from the tool's own code (its records hold
    detached aliases made before writes), past torch's dispatch of it, the tool's mode and the entry
    wrappers (`entries`: `x += y`'s and `F.relu`'s while a session runs) between the program and the call."""
    frame = sys._getframe(depth + 1)
    while frame is not None and (frame.f_code.co_filename.startswith(TORCH_DIR) or frame.f_code.co_filename == __file__
                                 or frame.f_code in entries
                                 or frame.f_code.co_name in ("__torch_function__", "_observed", "_stale_read")):
        frame = frame.f_back  # type: ignore[assignment]
    return frame is not None and is_tool_file(frame.f_code.co_filename)


def reads(func: Any, out: Any, stale: list[tuple[Overwritten, torch.Tensor]], args: Any, kwargs: Any) -> bool:
    """Whether a call handed stale aliases read their values (not only metadata, not only a view made)."""
    name = getattr(func, "__name__", "")
    if name in _METADATA or (name in _OVERWRITES and args and all(t is args[0] for _, t in stale)):
        return False
    if name in _AUGMENTED or (kwargs and kwargs.get("inplace") is True):
        return True  # reads what it updates, and returns it
    returned = [t for t in (out if isinstance(out, (list, tuple)) else (out,)) if isinstance(t, torch.Tensor)]
    if not returned:
        return True  # `item()`, `tolist()`, `equal()`: values read into Python
    if name.endswith("_") and not name.startswith("_"):
        return True  # an in-place method reads what it updates
    handed = {storage_key(t) for _, t in stale}
    # every result over a stale alias's memory, none a new tensor: a view, `detach()`, `contiguous()`
    return not all(storage_key(t) in handed for t in returned)


def before_values_difference(entry: Overwritten, t: torch.Tensor) -> float:
    """The largest difference between what `t` holds now and held before the entry's write."""
    target = entry.ref()
    snapshot = entry.snapshot
    if snapshot is None or target is None or t.dtype != target.dtype or not (t.is_floating_point() or t.is_complex()):
        return _whole(entry, target)
    with _compat.DisableTorchDispatch(), torch.no_grad():
        first = min(int(t.storage_offset()), int(target.storage_offset()))
        last = max(last_element(t), last_element(target))
        if last - first + 1 > _EXACT_LIMIT:
            return _whole(entry, target)
        memory = torch.empty(0, dtype=t.dtype, device=t.device)
        memory.set_(t.untyped_storage(), first, (last - first + 1,), (1,))
        before = memory.clone()  # the memory now, then the written elements as they were
        before.as_strided(target.shape, target.stride(), int(target.storage_offset()) - first).copy_(snapshot)
        was = before.as_strided(t.shape, t.stride(), int(t.storage_offset()) - first)
        difference = float((t - was).abs().max()) if t.numel() else 0.0
    return difference if finite(difference) else _whole(entry, target)


def _whole(entry: Overwritten, target: torch.Tensor | None) -> float:
    """The write's largest change over all it wrote (what a read of part of it read at most)."""
    if entry.snapshot is None or target is None:
        return float(entry.change or 0.0)
    with _compat.DisableTorchDispatch(), torch.no_grad():
        return float((target.double() - entry.snapshot.double()).abs().max()) if target.numel() else 0.0

