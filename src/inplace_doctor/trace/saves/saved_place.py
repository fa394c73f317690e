"""Who saved a tensor and where (`SavedRecord.place()`), for reports that name many saves at once."""

from __future__ import annotations

from typing import Any, NamedTuple

from ..places.modules import ModuleContext
from ..places.stacks import SAVE_STACK, RawFrame, resolve_stacks


class SavedPlace(NamedTuple):
    """Who saved a tensor and where (`SavedRecord.place()`); `stack` is a capture or its resolution."""

    node: str | None
    field: str | None
    op: str | None
    module: ModuleContext | None
    in_backward: bool
    stack: Any

    @staticmethod
    def resolve_all(places: list[SavedPlace]) -> dict[int, tuple[tuple[RawFrame, ...], str | None, bool]]:
        """id(place.stack) -> (user frames, torch api, inside a checkpoint region), in one batch."""
        todo = {id(p.stack): p.stack for p in places if not isinstance(p.stack, tuple)}
        resolved = dict(zip(todo, resolve_stacks(list(todo.values()), SAVE_STACK)))
        resolved.update((id(p.stack), p.stack) for p in places if isinstance(p.stack, tuple))
        return resolved
