"""Tensors handed out that share memory with live state: `state_dict()` entries.

`model.state_dict()` returns aliases of the parameters and buffers (same
memory, no copy). Code that keeps the dict as a snapshot (`best =
model.state_dict()`) silently sees every later optimizer step. While tracing,
`nn.Module.state_dict` is wrapped (outermost calls only; undone when the last
session ends, in any order) and
the tensors it returns are held weakly: a dict that is dropped raises nothing.

A write through the alias itself (an EMA updating its own `state_dict()`
values with `copy_` or `_foreach_lerp_`) is the holder's intent. A write
through another path (the optimizer's step on the parameter) makes the alias
*stale*; that is a hazard only when the stale alias is then used as a snapshot,
which is reported with both lines: read together with its live tensor
(`load_state_dict` onto the model it came from, a before/after comparison), or
copied: `clone`, `copy_` into another tensor (`other.load_state_dict(best)`),
`.to()` another device, `copy.deepcopy`, `torch.save` (the last two wrapped
while tracing, like `state_dict`; they read storages without an op). A stale
alias read by arithmetic (an EMA's source dict: `ema.mul_(d).add_(src, alpha=1
- d)`) makes its whole dict a live view: not reported, nor are later copies out
of that dict, nor is it listed as stale at the end. `.detach()`/`.data` of a
stale alias is the same alias. All of this costs per op only while an alias is
stale.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch

from ...events import HeldTensorUsed
from ...sites import Site
from ..ops import op_name
from ..owner import TraceOwner
from ..places.modules import ModulePaths
from ..places.stacks import capture_frames, make_site
from ..process.shared_patches import ABSENT, SharedGroup, SharedPatch
from ..raised.blame import call_through
from ..saves.storage import storage_key, storage_span


class _Held:
    __slots__ = ("ref", "label", "site", "span", "stale", "live", "__weakref__")

    def __init__(
        self, t: torch.Tensor, label: str, site: Site, span: tuple[int, int, int], live: list[bool]
    ) -> None:
        self.ref = weakref.ref(t)
        self.label = label
        self.site = site
        self.span = span
        self.stale: Any = None  # the HeldTensorOverwritten of a write through another path
        # shared by the entries of one state_dict() call (and their detaches): True once one of them,
        # stale, was read by arithmetic: the holder keeps that dict as a live view
        self.live = live


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
        self._detached = False  # a `.detach()` of a stale alias was followed: a report looks for them too

    def __enter__(self) -> HeldTensors:
        _GROUP.acquire(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _GROUP.release(self)
        self.by_storage.clear()
        self.stale_ids.clear()
        self._aliases.clear()
        self._detached = False

    def _remember(self, module: torch.nn.Module, result: Any) -> None:
        frames, api = capture_frames()
        site = make_site("state_dict", frames, api, self.modules.current, "forward")
        path = self.modules.path_of(module)
        live = [False]
        for name, value in result.items():
            if isinstance(value, torch.Tensor):
                span = storage_span(value)
                if span is not None:
                    label = f"{path}.state_dict()[{name!r}]"
                    self.by_storage.setdefault(span[0], []).append(_Held(value, label, site, span, live))
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

    def check_uses(self, func: Any, args: Any, kwargs: Any, written: Any) -> _Held | None:
        """An op using a stale alias as a snapshot: reading it together with another tensor on the
        same memory (`load_state_dict(best)` copies it onto the parameter it aliases; a before/after
        comparison reads both), or copying it (`clone`, `copy_` from it into another tensor, `.to()`
        another device). A stale alias read otherwise is a live view (BigGAN's EMA keeps
        `source.state_dict()` to read the current weights into its own): not a snapshot use.
        Returns the stale alias that `detach`/`alias` reads: its output is that alias too."""
        tensors = [
            item
            for value in (*args, *kwargs.values())
            for item in (value if isinstance(value, (list, tuple)) else (value,))
            if isinstance(item, torch.Tensor)
        ]
        aliased = None
        for item in tensors:
            entry = self.stale_ids.get(id(item))
            if entry is None or entry.ref() is not item or (written and any(w is item for w in written)):
                continue
            name = op_name(func)
            how: str | None
            if any(other is not item and storage_key(other) == entry.span[0] for other in tensors):
                how = _with_live_tensor(name)
            elif func in _ALIAS_OPS:
                aliased = entry
                continue
            else:
                how = _copied(name, args, kwargs, item)
                if how is None:
                    entry.live[0] = True  # arithmetic: the holder reads its dict as a live view
                    continue
                if entry.live[0]:
                    continue  # a copy out of a dict the holder reads as a live view: the current values
            self._report(entry, make_site(name, *capture_frames(), self.modules.current, "forward"), how)
        return aliased

    def alias_of_stale(self, entry: _Held, out: Any) -> None:
        """`out` (a `detach()`/`.data` of a stale alias) is the same alias: followed until it dies."""
        if not isinstance(out, torch.Tensor) or entry.stale is None:
            return
        derived = _Held(out, entry.label, entry.site, entry.span, entry.live)
        derived.stale = entry.stale
        key = id(out)
        stale_ids = self.stale_ids
        holder = weakref.ref(derived)  # the callback must not keep the entry alive

        def forget(_ref: Any) -> None:
            if stale_ids.get(key) is holder():
                stale_ids.pop(key, None)

        derived.ref = weakref.ref(out, forget)
        stale_ids[key] = derived
        self._detached = True

    def _report(self, entry: _Held, use: Site, how: str) -> None:
        overwritten = entry.stale
        same = [k for k, e in self.stale_ids.items() if e.stale is overwritten] if self._detached else [id(entry.ref())]
        for key in same:  # it and its detaches
            other = self.stale_ids.pop(key)
            other.stale = None
            other.ref = _gone  # type: ignore[assignment]  # reported once: later writes (the load) are not news
        self.owner.emit(HeldTensorUsed(overwritten, use, how))

    def _snapshot_call(self, what: Any, call: str) -> None:
        """`copy.deepcopy` or `torch.save` about to copy `what`: each stale alias in it is used as a snapshot."""
        if self.owner.busy:
            return
        for item in _tensors_in(what, 4):
            entry = self.stale_ids.get(id(item))
            if entry is not None and entry.ref() is item and entry.stale is not None and not entry.live[0]:
                self._report(entry, make_site(call, *capture_frames(), self.modules.current, "forward"), _copied_by(call))

    def unused_stale(self) -> list[Any]:
        """The overwrites of aliases still held and stale when the session ends (never used since)."""
        found = {  # by event: an alias and its detaches share one
            id(e.stale): e.stale
            for e in self.stale_ids.values()
            if e.ref() is not None and e.stale is not None and not e.live[0]
        }
        return list(found.values())


# -- the wrappers, one per process for all sessions (`shared_patches.py`): each tells the sessions
# entered on the calling thread, and is torch's own again once the last session has left
_depth = threading.local()  # state_dict() calls running on this thread: only the outermost is held


def _state_dict(original: Any) -> Any:
    def state_dict(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        sessions = _STATE_DICT.here()
        if not sessions:
            return call_through(original, (module, *args), kwargs)
        depth = getattr(_depth, "n", 0)
        _depth.n = depth + 1
        try:
            result = call_through(original, (module, *args), kwargs)
        finally:
            _depth.n = depth
        if depth == 0 and not args and not kwargs.get("destination") and not kwargs.get("keep_vars"):
            for held in sessions:
                held._remember(module, result)
        return result

    state_dict.__wrapped__ = original  # type: ignore[attr-defined]
    return state_dict


def _deepcopy(original: Any) -> Any:
    """`Tensor.__deepcopy__` passes a stale alias to `_snapshot_call` first (it reads storages without an op)."""
    if original is ABSENT:
        return None

    def __deepcopy__(tensor: torch.Tensor, memo: Any) -> Any:
        for held in _DEEPCOPY.here():
            if held.stale_ids:
                held._snapshot_call(tensor, "copy.deepcopy")
        return original(tensor, memo)

    __deepcopy__.__wrapped__ = original  # type: ignore[attr-defined]
    return __deepcopy__


def _save(original: Any) -> Any:
    """`torch.save` likewise."""

    def torch_save(obj: Any, *args: Any, **kwargs: Any) -> Any:
        for held in _SAVE.here():
            if held.stale_ids:
                held._snapshot_call(obj, "torch.save")
        return call_through(original, (obj, *args), kwargs)

    torch_save.__wrapped__ = original  # type: ignore[attr-defined]
    return torch_save


_STATE_DICT: SharedPatch[HeldTensors] = SharedPatch(torch.nn.Module, "state_dict", _state_dict)
_DEEPCOPY: SharedPatch[HeldTensors] = SharedPatch(torch.Tensor, "__deepcopy__", _deepcopy)
_SAVE: SharedPatch[HeldTensors] = SharedPatch(torch, "save", _save)
_PATCHES = (_STATE_DICT, _DEEPCOPY, _SAVE)
_GROUP: SharedGroup[HeldTensors] = SharedGroup(list(_PATCHES))  # made and undone together


def _gone() -> None:
    return None


_ALIAS_OPS = frozenset({torch.ops.aten.detach.default, torch.ops.aten.alias.default})


def _copied(name: str, args: Any, kwargs: Any, item: torch.Tensor) -> str | None:
    """How an op reading a stale alias on its own copies it (a snapshot made of it); None for a read
    that copies nothing (arithmetic: a live view's use) or a cast on the same device."""
    if name == "aten.clone":
        return _copied_by("clone")
    if name in ("aten.copy_", "aten._foreach_copy_") and len(args) > 1:
        sources = args[1] if isinstance(args[1], (list, tuple)) else (args[1],)
        if any(s is item for s in sources):
            return _copied_by(name.removeprefix("aten."), into_another=True)
    if name == "aten._to_copy":
        device = kwargs.get("device")
        if device is not None and torch.device(device) != item.device:
            return _copied_by("to")
    return None


def _tensors_in(obj: Any, depth: int) -> list[torch.Tensor]:
    """The tensors in `obj`, in dicts, lists and tuples nested up to `depth` deep (a checkpoint's layout)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth <= 0:
        return []
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    return [t for item in items for t in _tensors_in(item, depth - 1)]


# -- the words of a use (kept apart: sentences move to render/) ----------------
def _with_live_tensor(name: str) -> str:
    how = "loaded onto the tensor it aliases" if name == "aten.copy_" else "compared or combined with the live tensor"
    return f"{how}, by `{name.removeprefix('aten.')}`"


def _copied_by(call: str, into_another: bool = False) -> str:
    return f"{'copied into another tensor' if into_another else 'copied as a snapshot'}, by `{call}`"
