"""Tensors handed out that share memory with live state: `state_dict()` entries.

`model.state_dict()` returns aliases of the parameters and buffers (same
memory, no copy). Code that keeps the dict as a snapshot (`best =
model.state_dict()`) silently sees every later optimizer step. While tracing,
`nn.Module.state_dict` is wrapped (outermost calls only; undone on exit) and
the tensors it returns are held weakly: a dict that is dropped raises nothing.

A write through the alias itself (an EMA updating its own `state_dict()`
values with `copy_` or `_foreach_lerp_`) is the holder's intent. A write
through another path (the optimizer's step on the parameter) makes the alias
*stale*; that is a hazard only when the stale alias is then used as a snapshot
(read by an op: `load_state_dict`, a comparison, a copy), which is reported.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from ..events import HeldTensorUsed
from ..sites import Site
from .blame import call_through
from .modules import ModulePaths
from .ops import op_name
from .owner import TraceOwner
from .stacks import capture_frames, make_site
from .storage import storage_key, storage_span


class _Held:
    __slots__ = ("ref", "label", "site", "span", "stale")

    def __init__(self, t: torch.Tensor, label: str, site: Site, span: tuple[int, int, int]) -> None:
        self.ref = weakref.ref(t)
        self.label = label
        self.site = site
        self.span = span
        self.stale: Any = None  # the HeldTensorOverwritten of a write through another path


class HeldTensors:
    """Registry of handed-out aliases by storage, and the `state_dict` wrapper that fills it."""

    def __init__(self, owner: TraceOwner, modules: ModulePaths) -> None:
        self.owner = owner
        self.modules = modules
        self.by_storage: dict[int, list[_Held]] = {}
        #: id(alias) -> entry, for aliases another path overwrote: their next use is reported
        self.stale_ids: dict[int, _Held] = {}
        # every alias handed out, by id (a write through one is deliberate); pruned with its entry
        self._aliases: dict[int, weakref.ref[torch.Tensor]] = {}
        self._original: Any = None
        self._depth = 0

    def __enter__(self) -> "HeldTensors":
        original = torch.nn.Module.state_dict
        self._original = original
        held = self

        def state_dict(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            held._depth += 1
            try:
                result = call_through(original, (module, *args), kwargs)
            finally:
                held._depth -= 1
            if held._depth == 0 and not args and not kwargs.get("destination") and not kwargs.get("keep_vars"):
                held._remember(module, result)
            return result

        state_dict.__wrapped__ = original  # type: ignore[attr-defined]
        torch.nn.Module.state_dict = state_dict  # type: ignore[method-assign, assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        if self._original is not None:
            torch.nn.Module.state_dict = self._original  # type: ignore[method-assign]
            self._original = None
        self.by_storage.clear()
        self.stale_ids.clear()
        self._aliases.clear()

    def _remember(self, module: torch.nn.Module, result: Any) -> None:
        frames, api = capture_frames()
        site = make_site("state_dict", frames, api, self.modules.current, "forward")
        path = self.modules.path_of(module)
        for name, value in result.items():
            if isinstance(value, torch.Tensor):
                span = storage_span(value)
                if span is not None:
                    label = f"{path}.state_dict()[{name!r}]"
                    self.by_storage.setdefault(span[0], []).append(_Held(value, label, site, span))
                    self._aliases[id(value)] = weakref.ref(value)

    def overwritten_by(self, span: tuple[int, int, int], written: torch.Tensor) -> list[_Held]:
        """Live held aliases whose memory `span` overlaps, written through another path than the alias
        itself; each becomes stale (the caller sets `stale`), and its next use is reported once."""
        entries = self.by_storage.get(span[0])
        if not entries:
            return []
        hit, keep = [], []
        # Written through an alias handed out (this one or another state_dict()'s): deliberate, as an EMA does.
        deliberate = self._handed_out(written) or (written._base is not None and self._handed_out(written._base))
        for entry in entries:
            alias = entry.ref()
            if alias is None:
                continue
            keep.append(entry)
            if not (entry.span[1] < span[2] and span[1] < entry.span[2]):
                continue
            if deliberate:
                entry.stale = None
                self.stale_ids.pop(id(alias), None)
            elif entry.stale is None:
                hit.append(entry)
                self.stale_ids[id(alias)] = entry
        if keep:
            self.by_storage[span[0]] = keep
        else:
            del self.by_storage[span[0]]
        if len(self._aliases) > 4096:
            self._aliases = {k: ref for k, ref in self._aliases.items() if ref() is not None}
        return hit

    def _handed_out(self, t: torch.Tensor) -> bool:
        ref = self._aliases.get(id(t))
        return ref is not None and ref() is t

    def check_uses(self, func: Any, args: Any, kwargs: Any, written: Any) -> None:
        """An op using a stale alias as a snapshot of its own live tensor: reading it together with
        another tensor on the same memory (`load_state_dict(best)` copies it onto the parameter it
        aliases; a before/after comparison reads both). A stale alias read on its own is a live view
        (BigGAN's EMA keeps `source.state_dict()` to read the current weights): not a snapshot use."""
        tensors = [
            item
            for value in (*args, *kwargs.values())
            for item in (value if isinstance(value, (list, tuple)) else (value,))
            if isinstance(item, torch.Tensor)
        ]
        for item in tensors:
            entry = self.stale_ids.get(id(item))
            if entry is None or entry.ref() is not item or (written and any(w is item for w in written)):
                continue
            if not any(other is not item and storage_key(other) == entry.span[0] for other in tensors):
                continue
            del self.stale_ids[id(item)]
            overwritten, entry.stale = entry.stale, None
            entry.ref = _gone  # type: ignore[assignment]  # reported once: later writes (the load) are not news
            frames, api = capture_frames()
            name = op_name(func)
            use = make_site(name, frames, api, self.modules.current, "forward")
            how = "loaded onto the tensor it aliases" if name == "aten.copy_" else "compared or combined with the live tensor"
            self.owner.emit(HeldTensorUsed(overwritten, use, f"{how}, by `{name.removeprefix('aten.')}`"))

    def unused_stale(self) -> list[Any]:
        """The overwrites of aliases still held and stale when the session ends (never used since)."""
        return [e.stale for e in self.stale_ids.values() if e.ref() is not None and e.stale is not None]


def _gone() -> None:
    return None
