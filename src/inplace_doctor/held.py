"""Tensors handed out that share memory with live state: `state_dict()` entries.

`model.state_dict()` returns aliases of the parameters and buffers (same
memory, no copy). Code that keeps the dict as a snapshot (`best =
model.state_dict()`) silently sees every later optimizer step. While tracing,
`nn.Module.state_dict` is wrapped (outermost calls only; undone on exit) and
the tensors it returns are held weakly: a dict that is saved or deep-copied and
dropped raises nothing.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch

from .sites import Site, capture_frames, make_site
from .storage import storage_span

if TYPE_CHECKING:
    from .tracer import Tracer


class _Held:
    __slots__ = ("ref", "label", "site", "span")

    def __init__(self, t: torch.Tensor, label: str, site: Site, span: tuple[int, int, int]) -> None:
        self.ref = weakref.ref(t)
        self.label = label
        self.site = site
        self.span = span


class HeldTensors:
    """Registry of handed-out aliases by storage, and the `state_dict` wrapper that fills it."""

    def __init__(self, tracer: "Tracer") -> None:
        self.tracer = tracer
        self.by_storage: dict[int, list[_Held]] = {}
        self._original: Any = None
        self._depth = 0

    def __enter__(self) -> "HeldTensors":
        original = torch.nn.Module.state_dict
        self._original = original
        held = self

        def state_dict(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            held._depth += 1
            try:
                result = original(module, *args, **kwargs)
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

    def _remember(self, module: torch.nn.Module, result: Any) -> None:
        frames, api = capture_frames()
        site = make_site("state_dict", frames, api, self.tracer.modules.current, "forward")
        owner = self.tracer.modules.path_of(module)
        for name, value in result.items():
            if isinstance(value, torch.Tensor):
                span = storage_span(value)
                if span is not None:
                    label = f"{owner}.state_dict()[{name!r}]"
                    self.by_storage.setdefault(span[0], []).append(_Held(value, label, site, span))

    def overwritten_by(self, span: tuple[int, int, int]) -> list[_Held]:
        """Live held aliases whose memory `span` overlaps; each is reported once, then dropped."""
        entries = self.by_storage.get(span[0])
        if not entries:
            return []
        hit, keep = [], []
        for entry in entries:
            if entry.ref() is None:
                continue
            if entry.span[1] < span[2] and span[1] < entry.span[2]:
                hit.append(entry)
            else:
                keep.append(entry)
        if keep:
            self.by_storage[span[0]] = keep
        else:
            del self.by_storage[span[0]]
        return hit
