"""`audit` of a callable that is no module: the modules it runs, found where the callable keeps them.

A rollout function, a policy object's `act`, a `functools.partial`, a model's own method other than
`forward` (`model.rollout`): `audit(fn, x)` runs `fn(x)` as it runs a model, with its arguments the
caller's inputs. What it restores and names are the modules it can find without running it: the
module a bound method belongs to, the modules its closure holds, the module-level names its code
reads, the attributes of the object it is bound to (or of the callable object itself), and, for a
`functools.partial`, those of its function and arguments.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch


def module_of_method(fn: Any) -> torch.nn.Module | None:
    """The module `fn` is a method of (`model.rollout`), or None."""
    owner = getattr(fn, "__self__", None)
    return owner if isinstance(owner, torch.nn.Module) and isinstance(fn, types.MethodType) else None


def modules_of(fn: Any, depth: int = 0) -> list[tuple[str, torch.nn.Module]]:
    """(label, module) for each module `fn` holds, as its code names it (`policy`, `model`), each once."""
    found: list[tuple[str, Any]] = []
    if isinstance(fn, torch.nn.Module):
        return [("model", fn)]
    if depth > 3:
        return found
    if isinstance(fn, functools.partial):
        found = [(label, m) for label, m in modules_of(fn.func, depth + 1)]
        found += [(f"args[{i}]", value) for i, value in enumerate(fn.args)]
        found += list(fn.keywords.items())
        return _once([(label, m) for label, m in found if isinstance(m, torch.nn.Module)])
    function = fn.__func__ if isinstance(fn, types.MethodType) else fn
    code = getattr(function, "__code__", None)
    if code is not None:
        cells = getattr(function, "__closure__", None) or ()
        found += [(name, _content(cell)) for name, cell in zip(code.co_freevars, cells)]
        names = getattr(function, "__globals__", {})
        found += [(name, names.get(name)) for name in code.co_names]
    holder = fn.__self__ if isinstance(fn, types.MethodType) else None if code is not None else fn
    if holder is not None:
        found += list(getattr(holder, "__dict__", {}).items())
    return _once([(label, m) for label, m in found if isinstance(m, torch.nn.Module)])


def _content(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not filled yet
        return None


def _once(found: list[tuple[str, torch.nn.Module]]) -> list[tuple[str, torch.nn.Module]]:
    seen: set[int] = set()
    kept = []
    for label, module in found:
        if id(module) not in seen:
            seen.add(id(module))
            kept.append((label, module))
    return kept


def name_of(fn: Any) -> str:
    """What the report calls the callable: `rollout`, `Agent.act`, the class of a callable object."""
    if isinstance(fn, functools.partial):
        return name_of(fn.func)
    return getattr(fn, "__qualname__", None) or type(fn).__name__
