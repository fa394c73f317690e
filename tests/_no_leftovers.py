"""What a session may leave behind in the process, snapshotted before and compared after.

`Leftovers.take()` records, without knowing what the tool patches:

- every attribute of every loaded module of torch, NumPy and the standard-library modules the tool
  touches (`_PREFIXES`), and of every class those modules define: the value's identity (a wrapper
  left in place of a method, a property added, a module function replaced, a flag left set);
- the global module hooks and the other hook dicts those modules hold (their keys);
- per thread and process state with no attribute: the dispatch-mode and torch-function-mode stacks,
  the saved-tensor hooks (and whether they are enabled), autograd's node-creation hooks, the trace
  and profile functions, the recursion limit, the warning filters, `torch.library`'s kernels;
- the tool's own context variables (a session's recorder left current).

`leftovers(before)` is what differs, as sentences naming each thing; `[]` when all is as before.
`Leftovers.quick()` takes only the attributes a session of the tool changes (found once per process
by taking full snapshots inside sessions of each kind: `touched()`) and the state: cheap enough to
check around every test.

Values torch itself changes as it runs (caches, counters, lazily imported submodules) are not
leftovers: `_CHANGES_ON_ITS_OWN` names them, each with why.
"""

from __future__ import annotations

import contextvars
import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

#: the top-level packages whose modules (and their classes) are snapshotted
_PREFIXES = ("torch", "numpy", "threading", "warnings", "copy", "pickle", "runpy", "builtins", "sys", "functools")
#: (module or class qualified name, attribute): rebound by torch itself as it runs, never by a patch
_CHANGES_ON_ITS_OWN: dict[tuple[str, str], str] = {
    ("torch.utils.hooks.RemovableHandle", "next_id"): "the id of the next hook handle: a counter",
}
#: prefixes of module names whose globals torch rebinds as it runs (compile caches, counters)
_MODULES_ON_THEIR_OWN: tuple[str, ...] = ()


def _name(namespace: Any) -> str:
    if isinstance(namespace, types.ModuleType):
        return namespace.__name__
    return f"{namespace.__module__}.{namespace.__qualname__}"


def _namespaces() -> list[Any]:
    """The loaded modules of `_PREFIXES` and the classes they define, each once."""
    modules = [
        m for name, m in list(sys.modules.items())
        if isinstance(m, types.ModuleType) and name.split(".")[0] in _PREFIXES
    ]
    seen: set[int] = set()
    found: list[Any] = []
    for module in modules:
        if id(module) in seen:
            continue
        seen.add(id(module))
        found.append(module)
        for value in list(vars(module).values()):
            if issubclass(type(value), type) and id(value) not in seen:  # not isinstance: `__class__` may warn
                owner = getattr(value, "__module__", None) or ""
                if isinstance(owner, str) and owner.split(".")[0] in _PREFIXES:
                    seen.add(id(value))
                    found.append(value)
    return found


def _node_creation_hooks() -> int:
    """How many node-creation hooks this thread has (PyTorch has no query: popped and counted; a
    leftover hook is gone after, so one leak does not fail every later test)."""
    n = 0
    while n < 16:
        try:
            torch._C._autograd._pop_node_creation_hook()
        except RuntimeError:  # empty: the assert PyTorch raises
            break
        n += 1
    return n


def _state() -> dict[str, Any]:
    """What has no attribute to snapshot: this thread's stacks, the process's trace, limit, filters.

    The fast tracer's kernels linger a second after the last session (`kernel_registration.py`):
    that linger is ended first, so what is compared is what stays after it."""
    import torch.utils._python_dispatch as python_dispatch

    kernels = sys.modules.get("inplace_doctor.trace.fast.write_kernels")
    if kernels is not None:
        kernels.end_linger()

    hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    return {
        "dispatch modes on this thread": torch._C._len_torch_dispatch_stack(),
        "torch function modes on this thread": torch._C._len_torch_function_stack(),
        "saved-tensor hooks on this thread": hooks is not None,
        "saved-tensor hooks enabled": torch._C._autograd._saved_tensors_hooks_is_enabled(),
        "node-creation hooks on this thread": _node_creation_hooks(),
        "in a mode without ignore_compile_internals": python_dispatch.is_in_any_mode_without_ignore_compile_internals(),
        "sys.gettrace()": sys.gettrace(),
        "sys.getprofile()": sys.getprofile(),
        "threading.gettrace()": threading.gettrace(),
        "threading.getprofile()": threading.getprofile(),
        "sys.getrecursionlimit()": sys.getrecursionlimit(),
        "warnings.filters": list(warnings.filters),  # type: ignore[attr-defined]  # a list at run time
        # at the key the tool registers its write kernels at (torch registers kernels at other keys
        # as it compiles: Meta, CUDA)
        "torch.library kernels at ADInplaceOrView": _kernels_at_the_tools_key(),
        "the tool's context variables": _context_variables(),
    }


_KERNELS: list[Any] = [-1, frozenset()]


def _kernels_at_the_tools_key() -> frozenset[str]:
    """`torch.library`'s kernels at `ADInplaceOrView` (looked for again when kernels were added or removed)."""
    import torch.library

    impls = torch.library._impls
    if len(impls) != _KERNELS[0]:
        _KERNELS[:] = [len(impls), frozenset(k for k in impls if k.endswith("/ADInplaceOrView"))]
    return _KERNELS[1]  # type: ignore[no-any-return]


def _context_variables() -> dict[str, Any]:
    """The tool's context variables that hold a value in this context (none, between sessions)."""
    return {name: var.get(None) for name, var in _tool_context_variables() if var.get(None) is not None}


_FOUND: tuple[int, list[tuple[str, contextvars.ContextVar[Any]]]] = (0, [])


def _tool_context_variables() -> list[tuple[str, contextvars.ContextVar[Any]]]:
    """Every `ContextVar` at the top level of the tool's modules (looked for again when modules were loaded)."""
    global _FOUND
    if len(sys.modules) != _FOUND[0]:
        modules = [(name, m) for name, m in list(sys.modules.items()) if name.startswith("inplace_doctor") and m is not None]
        found = [
            (f"{name}.{attr}", value)
            for name, module in modules
            for attr, value in list(vars(module).items())
            if isinstance(value, contextvars.ContextVar)
        ]
        _FOUND = (len(sys.modules), found)
    return _FOUND[1]


def _hook_dicts(namespaces: Iterable[Any]) -> dict[str, tuple[Any, ...]]:
    """The keys of each module-level dict named for hooks (`_global_forward_hooks`, ...)."""
    keys: dict[str, tuple[Any, ...]] = {}
    for namespace in namespaces:
        if not isinstance(namespace, types.ModuleType):
            continue
        for attr, value in list(vars(namespace).items()):
            if "hook" in attr.lower() and isinstance(value, dict):
                keys[f"{namespace.__name__}.{attr}"] = tuple(value)
    return keys


@dataclass
class Leftovers:
    """A snapshot: attributes by namespace (identity of each value), hook dict keys, state."""

    attributes: dict[int, tuple[Any, dict[str, Any]]] = field(default_factory=dict)
    hooks: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    full: bool = True

    @classmethod
    def take(cls, state: bool = True) -> Leftovers:
        """Everything (`state=False`: the attributes and hook dicts only, as a session may hold
        state that taking it would change: the node-creation hooks are counted by popping them)."""
        namespaces = _namespaces()
        return cls(
            {id(ns): (ns, dict(vars(ns))) for ns in namespaces}, _hook_dicts(namespaces), _state() if state else {}, True
        )

    @classmethod
    def quick(cls) -> Leftovers:
        """Only what sessions of the tool are known to change (`touched()`), and the state."""
        attributes: dict[int, tuple[Any, dict[str, Any]]] = {}
        for namespace, names in touched():
            attributes[id(namespace)] = (namespace, {n: vars(namespace).get(n, _ABSENT) for n in names})
        import torch.nn.modules.module as mm

        return cls(attributes, _hook_dicts([mm]), _state(), False)

    def changed(self, other: Leftovers) -> list[tuple[Any, str]]:
        """(namespace, attribute) of each attribute that differs in `other` (a later snapshot)."""
        found: list[tuple[Any, str]] = []
        for key, (namespace, before) in self.attributes.items():
            after = other.attributes.get(key, (namespace, {}))[1]
            for name in before.keys() | after.keys():
                if before.get(name, _ABSENT) is not after.get(name, _ABSENT) and not _on_its_own(namespace, name, before, after):
                    found.append((namespace, name))
        return found


_ABSENT = object()


def _on_its_own(namespace: Any, name: str, before: dict[str, Any], after: dict[str, Any]) -> bool:
    if (_name(namespace), name) in _CHANGES_ON_ITS_OWN:
        return True
    if isinstance(namespace, types.ModuleType):
        if namespace.__name__.startswith(_MODULES_ON_THEIR_OWN):
            return True
        if name not in before and isinstance(after.get(name), types.ModuleType):
            return True  # a submodule imported meanwhile
    return False


def leftovers(before: Leftovers) -> list[str]:
    """What differs from `before` now, one sentence each; [] when nothing does."""
    after = Leftovers.take() if before.full else Leftovers.quick()
    found = [
        f"{_name(ns)}.{name}: {_show(before.attributes[id(ns)][1].get(name, _ABSENT))} -> "
        f"{_show(vars(ns).get(name, _ABSENT))}"
        for ns, name in before.changed(after)
    ]
    for name, keys in before.hooks.items():
        now = after.hooks.get(name, ())
        if now != keys:
            found.append(f"{name}: keys {keys} -> {now}")
    for what, value in before.state.items():
        now = after.state[what]
        if now != value:
            found.append(f"{what}: {_show(value)} -> {_show(now)}")
    return found


def put_back(before: Leftovers) -> None:
    """Undo what `leftovers(before)` found, as far as it can: attributes set back (or deleted), this
    thread's mode and hook stacks popped to their length before (so one leak fails one test)."""
    for namespace, name in before.changed(Leftovers.take() if before.full else Leftovers.quick()):
        value = before.attributes[id(namespace)][1].get(name, _ABSENT)
        if value is _ABSENT:
            delattr(namespace, name)
        else:
            setattr(namespace, name, value)
    while torch._C._len_torch_dispatch_stack() > before.state["dispatch modes on this thread"]:
        torch._C._pop_torch_dispatch_stack(None)
    while torch._C._len_torch_function_stack() > before.state["torch function modes on this thread"]:
        torch._C._pop_torch_function_stack()
    if not before.state["saved-tensor hooks on this thread"]:
        while torch._C._autograd._top_saved_tensors_default_hooks(False) is not None:
            torch._C._autograd._pop_saved_tensors_default_hooks()
    if before.state["sys.gettrace()"] is None:
        sys.settrace(None)


def _show(value: Any) -> str:
    if value is _ABSENT:
        return "(absent)"
    text = repr(value)
    return text if len(text) < 120 else text[:117] + "..."


_TOUCHED: list[tuple[Any, tuple[str, ...]]] | None = None


def touched() -> list[tuple[Any, tuple[str, ...]]]:
    """(namespace, attributes) a session of the tool changes while it runs, found once per process:
    a full snapshot taken inside a session of each kind (`SESSIONS`) compared with one before."""
    global _TOUCHED
    if _TOUCHED is None:
        warm_up()
        by_namespace: dict[int, tuple[Any, set[str]]] = {}
        for enter in SESSIONS.values():
            before = Leftovers.take()
            inside: list[Leftovers] = []
            enter(lambda inside=inside: inside.append(Leftovers.take(state=False)))  # type: ignore[misc]
            for namespace, name in before.changed(inside[0]):
                by_namespace.setdefault(id(namespace), (namespace, set()))[1].add(name)
        _TOUCHED = [(ns, tuple(sorted(names))) for ns, names in by_namespace.values()]
    return _TOUCHED


_WARM = [False]


def warm_up() -> None:
    """Run a session of each kind once: what torch sets up at first use (lazy imports, registrations,
    caches) is then done, not a leftover of the next one."""
    if not _WARM[0]:
        for enter in SESSIONS.values():
            enter(lambda: None)
        _WARM[0] = True


def _small_step() -> None:
    """A forward and backward with a save, a write, a hand-out and a state_dict: every patch used."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    x = torch.randn(2, 3, requires_grad=True)
    y = model(x).sigmoid()
    y.detach().numpy()
    model.state_dict()
    y.sum().backward()


def _watch(**kwargs: Any) -> Callable[[Callable[[], None]], None]:
    def run(inside: Callable[[], None]) -> None:
        import inplace_doctor as ipd

        with ipd.watch(**kwargs):
            _small_step()
            inside()

    return run


class _Step(torch.nn.Module):
    """A model whose forward is `_small_step` and then `inside()` (a snapshot in the session)."""

    def __init__(self, inside: Callable[[], None]) -> None:
        super().__init__()
        self.inside = inside
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _small_step()
        self.inside()
        return self.linear(x).relu()


def _audit(inside: Callable[[], None], **kwargs: Any) -> None:
    import inplace_doctor as ipd

    ipd.audit(_Step(inside), torch.randn(2, 3), **kwargs)


#: the kinds of session whose patches `touched()` collects
SESSIONS: dict[str, Callable[[Callable[[], None]], None]] = {
    "watch (fast)": _watch(),
    "watch (deep)": _watch(deep=True),
    "watch (check_contents)": _watch(check_contents=True),
    "watch (deep, check_contents)": _watch(deep=True, check_contents=True),
    "audit": _audit,
}
