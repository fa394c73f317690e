"""Names the user wrote for a module the tracer meets outside any known root: a variable (`D`), or
the attribute path from the user's own objects (`trainer.critic`, `steps[0]`), never a loop variable."""

from __future__ import annotations

import dis
import functools
import sys
import types
from collections.abc import Iterator
from types import CodeType, FrameType
from typing import Any

import torch

from ... import _compat

_STORES = frozenset({"STORE_FAST", "STORE_NAME", "STORE_GLOBAL", "STORE_DEREF"})
_UNPACKS = frozenset({"UNPACK_SEQUENCE", "UNPACK_EX"})
_USER_FRAMES = 8  # user frames whose names are searched, innermost first
_DEPTH = 4  # attribute steps from a name the user wrote (`trainer.agent.critic.qf1` is three)
_VISITS = 4000  # objects looked at, at most: the search runs once per module first seen
_ITEMS = 64  # elements of one list, tuple or dict looked at
_SELF_NAMES = frozenset({"self", "cls"})  # names every method has: paths through them come last


@functools.lru_cache(maxsize=256)
def loop_targets(code: CodeType) -> frozenset[str]:
    """The names `code` rebinds on every turn of a `for` loop (`s` in `for s in steps`)."""
    names: set[str] = set()
    after_for = False
    for ins in dis.get_instructions(code):
        if ins.opname == "FOR_ITER":
            after_for = True
        elif after_for and ins.opname in _STORES:
            names.add(ins.argval)
        elif not (after_for and ins.opname in _UNPACKS):
            after_for = False
    return frozenset(names)


def _user_frames() -> Iterator[FrameType]:
    from .stacks import is_user_file

    frame: FrameType | None = sys._getframe(3)
    found = 0
    while frame is not None and found < _USER_FRAMES:
        if is_user_file(frame.f_code.co_filename):
            found += 1
            yield frame
        frame = frame.f_back


def _bound_names(scope: dict[str, Any], module: torch.nn.Module, skip: frozenset[str]) -> list[str]:
    return [n for n, v in list(scope.items()) if v is module and not n.startswith("_") and n not in skip and n.isidentifier()]


def variable_name(module: torch.nn.Module) -> str | None:
    """What the user calls `module`: the one name the innermost user frame binds to it (locals, then
    globals), else the shortest attribute path to it from the names of the user's frames.

    A loop variable (`for s in steps: s(x)`) names a different module on every turn: it names none;
    the path through the list (`steps[0]`) does. None when nothing the user wrote reaches it.
    """
    frames = list(_user_frames())
    if not frames:
        return None
    inner = frames[0]
    # `self` in a method that calls its own module (`self(x)`) says nothing about which module it is.
    for scope, skip in ((_compat.frame_locals(inner), loop_targets(inner.f_code) | _SELF_NAMES), (inner.f_globals, frozenset())):
        names = _bound_names(scope, module, skip)
        if len(names) == 1:
            return names[0]
        if names:
            return None  # two names for one module: neither is the name
    return attribute_path(module, frames)


def _roots(frames: list[FrameType]) -> list[tuple[str, Any]]:
    """The names of the user's frames, innermost first: locals (less loop variables), then globals;
    `self` and `cls` last, since every method has them."""
    roots: list[tuple[str, Any]] = []
    last: list[tuple[str, Any]] = []
    seen_globals: set[int] = set()
    for frame in frames:
        skip = loop_targets(frame.f_code)
        scopes = [_compat.frame_locals(frame)]
        if id(frame.f_globals) not in seen_globals:
            seen_globals.add(id(frame.f_globals))
            scopes.append(frame.f_globals)
        for scope in scopes:
            for name, value in list(scope.items()):
                if name.startswith("_") or name in skip or not name.isidentifier():
                    continue
                (last if name in _SELF_NAMES else roots).append((name, value))
    return roots + last


# A place the search reached: (the object, the place it was reached from or None for a name in a
# frame, how: "" a name, "." an attribute, "[" an index or key, the name, index or key). Its path is
# written out only for the place that holds the module.
_Place = tuple[Any, Any, str, Any]


def attribute_path(module: torch.nn.Module, frames: list[FrameType]) -> str | None:
    """The shortest path (`trainer.critic`, `steps[0]`) from a name in `frames` to `module`,
    through submodules, lists, tuples, dicts and objects of classes the user defined."""
    level: list[_Place] = [(value, None, "", name) for name, value in _roots(frames)]
    visited: set[int] = set()
    for depth in range(_DEPTH + 1):
        # The whole level is looked through before any of it is opened: the shortest path is
        # found without opening what lies beside it (a list of 60 modules beside `w.model`).
        for place in level:
            if place[0] is module and not (place[1] is None and place[3] in _SELF_NAMES):
                return _written(place)
        if depth == _DEPTH:
            break
        following: list[_Place] = []
        for place in level:
            value = place[0]
            if id(value) in visited or len(visited) >= _VISITS:
                continue
            visited.add(id(value))
            if type(value) not in _BARREN:
                following.extend(_children(place, value))
        level = following
    return None


#: exact types whose objects `_children` finds nothing in (most of a frame's globals): not asked
_BARREN = frozenset(
    {types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type, str, int, float, bool, type(None)}
)


def _written(place: _Place) -> str:
    pieces: list[str] = []
    while place[1] is not None:
        _, parent, how, key = place
        pieces.append(f".{key}" if how == "." else f"[{key!r}]")
        place = parent
    pieces.append(place[3])
    return "".join(reversed(pieces))


def _children(place: _Place, value: Any) -> list[_Place]:
    """What `value` holds; reads dictionaries only (no property, no `__getattr__` runs)."""
    if isinstance(value, torch.nn.Module):
        return [(sub, place, ".", name) for name, sub in list(value._modules.items()) if sub is not None]
    if isinstance(value, (list, tuple)):
        return [(item, place, "[", i) for i, item in enumerate(value[:_ITEMS])]
    if isinstance(value, dict):
        items = list(value.items())[:_ITEMS]
        return [(item, place, "[", key) for key, item in items if isinstance(key, (str, int))]
    if _is_users_object(value):
        try:
            attrs = vars(value)
        except TypeError:  # a class with __slots__ only
            return []
        return [(item, place, ".", name) for name, item in list(attrs.items()) if isinstance(name, str)]
    return []


def _is_users_object(value: Any) -> bool:
    """An instance (with a `__dict__`) of a class the user wrote, or a `SimpleNamespace`."""
    if isinstance(value, types.SimpleNamespace):
        return True
    cls = type(value)
    if isinstance(value, (type, types.ModuleType, types.FunctionType, torch.Tensor)):
        return False
    return _class_is_users(cls)


_users_classes: dict[type, bool] = {}


def _class_is_users(cls: type) -> bool:
    from .stacks import is_user_file

    known = _users_classes.get(cls)
    if known is None:
        codes = [c for c in (getattr(a, "__code__", None) for a in list(vars(cls).values())) if isinstance(c, CodeType)]
        if codes:
            known = is_user_file(codes[0].co_filename)
        else:
            file = getattr(sys.modules.get(cls.__module__), "__file__", None)
            known = isinstance(file, str) and is_user_file(file)
        _users_classes[cls] = known
    return known
