"""Where a module with an `inplace` flag was constructed: the line a flag fix edits.

A flag fix (`inplace=True` -> `inplace=False`) belongs where the module was
built (`self.act = nn.ReLU(inplace=True)`, or the `nn.Sequential(...)` call),
not where it runs. Two ways to find it, best first:

- recorded: while the tracer runs (all of `inplace-doctor run`, and the CLI's
  model factory), a global module-registration hook captures the stack each
  time a module with an `inplace` flag is registered as a submodule;
- read from source: the parent module's class assigns it (`self.relu =
  ...`), or its parent's class builds the container with it as a positional
  argument (`self.features = nn.Sequential(..., nn.ReLU(inplace=True))`), or
  the only `ReLU(..., inplace=True)` call in the file that runs it.

Nothing is guessed: when none of these is unique, there is no origin and the
fix names the module path alone.
"""

from __future__ import annotations

import ast
import functools
import inspect
import linecache
import textwrap
import weakref
from typing import Any

import torch

from ..._parsing import parse
from ...sites import Frame
from .stacks import capture_stack, resolve_stack

_recorded: weakref.WeakKeyDictionary[torch.nn.Module, Any] = weakref.WeakKeyDictionary()
_resolved: weakref.WeakKeyDictionary[torch.nn.Module, Frame | None] = weakref.WeakKeyDictionary()


def _has_flag(module: torch.nn.Module) -> bool:
    return isinstance(module.__dict__.get("inplace"), bool)


def _on_registration(parent: torch.nn.Module, name: str, submodule: Any) -> None:
    if isinstance(submodule, torch.nn.Module) and _has_flag(submodule) and submodule not in _recorded:
        _recorded[submodule] = (capture_stack(), name)


class ConstructionRecorder:
    """Records the construction stack of flagged modules registered while active (nestable, undone on exit)."""

    def __init__(self) -> None:
        self._handle: Any = None

    def __enter__(self) -> ConstructionRecorder:
        register = getattr(torch.nn.modules.module, "register_module_module_registration_hook", None)
        if register is not None:
            self._handle = register(_on_registration)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def origin_of(module: torch.nn.Module, parent: torch.nn.Module | None, name: str, grandparent: Any = None,
              parent_name: str = "", search_files: tuple[str, ...] = ()) -> Frame | None:
    """The line that constructed `module` (registered as `name` in `parent`), or None."""
    try:
        cached = _resolved.get(module)
    except TypeError:
        return None
    if cached is not None or module in _resolved:
        return cached
    found = _from_record(module) or _from_source(module, parent, name, grandparent, parent_name, search_files)
    _resolved[module] = found
    return found


def _from_record(module: torch.nn.Module) -> Frame | None:
    recorded = _recorded.get(module)
    if recorded is None:
        return None
    captured, name = recorded
    frames, _, _ = resolve_stack(captured, 1)
    if not frames:
        return None
    file, line, function = frames[-1]
    index = int(name) if name.isdigit() else None
    return Frame(file, _argument_line(file, line, type(module).__name__, index), function)


def _from_source(module: torch.nn.Module, parent: Any, name: str, grandparent: Any, parent_name: str,
                 search_files: tuple[str, ...]) -> Frame | None:
    cls_name = type(module).__name__
    if parent is not None and not _is_container(parent):
        found = _assigned_in_class(type(parent), name)
        if found is not None:
            return found
    if parent is not None and _is_container(parent) and name.isdigit() and grandparent is not None:
        found = _positional_in_class(type(grandparent), parent_name, int(name), cls_name)
        if found is not None:
            return found
    for file in search_files:
        calls = _flagged_calls(file, cls_name)
        if len(calls) == 1:
            return Frame(file, calls[0], "<module>")
    return None


def _is_container(module: Any) -> bool:
    return isinstance(module, (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict))


def _class_tree(cls: type) -> tuple[str, int, ast.AST] | None:
    try:
        file = inspect.getsourcefile(cls)
        lines, start = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return None
    if file is None:
        return None
    try:
        tree = parse(textwrap.dedent("".join(lines)))
    except SyntaxError:
        return None
    return file, start, tree


def _class_sources(cls: type) -> Any:
    """(class, file, first line, parsed source) for `cls` and its bases, up to the first torch class."""
    for klass in cls.__mro__:
        if klass.__module__.startswith("torch.") or klass is object:
            return
        parsed = _class_tree(klass)
        if parsed is not None:
            yield (klass, *parsed)


def _assigned_in_class(cls: type, name: str) -> Frame | None:
    """`self.<name> = ...` in the class's source (any method): the assignment's value line."""
    for klass, file, start, tree in _class_sources(cls):
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Attribute) and t.attr == name and isinstance(t.value, ast.Name) and t.value.id == "self"
                for t in node.targets
            ):
                return Frame(file, start + node.value.lineno - 1, klass.__name__)
    return None


def _positional_in_class(cls: type, container: str, index: int, cls_name: str) -> Frame | None:
    """`self.<container> = nn.Sequential(a, b, ...)`: the line of positional argument `index`."""
    for klass, file, start, tree in _class_sources(cls):
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
                continue
            if not any(isinstance(t, ast.Attribute) and t.attr == container for t in node.targets):
                continue
            arg = _positional_call(node.value, index, cls_name)
            if arg is not None:
                return Frame(file, start + arg.lineno - 1, klass.__name__)
    return None


def _positional_call(call: ast.Call, index: int, cls_name: str) -> ast.Call | None:
    """Positional argument `index` of `call` when it is a `<cls_name>(...)` call (no `*args` before it)."""
    args = call.args
    if index < len(args) and not any(isinstance(a, ast.Starred) for a in args[: index + 1]):
        arg = args[index]
        if isinstance(arg, ast.Call) and _call_name(arg) == cls_name:
            return arg
    return None


def _call_name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


@functools.lru_cache(maxsize=128)
def _file_tree(file: str) -> ast.AST | None:
    try:
        return parse("".join(linecache.getlines(file)))
    except (SyntaxError, ValueError):
        return None


def _flagged_calls(file: str, cls_name: str) -> list[int]:
    """Lines of `<cls_name>(..., inplace=True)` calls in a file."""
    tree = _file_tree(file)
    if tree is None:
        return []
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and _call_name(node) == cls_name
        and any(k.arg == "inplace" and isinstance(k.value, ast.Constant) and k.value.value is True for k in node.keywords)
    )


def _argument_line(file: str, line: int, cls_name: str, index: int | None) -> int:
    """Inside a multi-line call recorded at `line` (`nn.Sequential(` ...), the line of the flagged argument:
    positional argument `index` when it is a `<cls_name>(...)` call, else the only such call nested in it."""
    tree = _file_tree(file)
    if tree is None:
        return line
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.lineno == line and (node.end_lineno or line) > line:
            arg = _positional_call(node, index, cls_name) if index is not None else None
            if arg is not None:
                return arg.lineno
            inner = [
                n.lineno
                for n in ast.walk(node)
                if isinstance(n, ast.Call) and n is not node and _call_name(n) == cls_name
                and any(k.arg == "inplace" for k in n.keywords)
            ]
            if len(inner) == 1:
                return inner[0]
    return line
