"""The module path active at each op, named like `model.named_modules()` does."""

from __future__ import annotations

import weakref
from typing import Any

import torch

from ._compat import TorchIncompatibleError  # noqa: F401  (import check first)

ModuleContext = tuple[str, int, str, "bool | None"]  # path, call index, class, inplace flag


class UnsupportedModuleError(TypeError):
    """A compiled or scripted module, which the tracer cannot see into."""


def refuse_opaque(module: torch.nn.Module, where: str) -> None:
    if isinstance(module, torch.jit.ScriptModule):
        raise UnsupportedModuleError(
            f"{where} is a TorchScript module ({type(module).__name__}); inplace-doctor traces eager "
            "PyTorch only: pass the original nn.Module instead of torch.jit.script/trace output."
        )
    if hasattr(module, "_orig_mod") and type(module).__name__ == "OptimizedModule":
        raise UnsupportedModuleError(
            f"{where} is a torch.compile'd module; inplace-doctor traces eager PyTorch only: pass "
            "the original module (model._orig_mod) instead."
        )


class ModuleTracker:
    """Global forward hooks keeping the stack of running modules and their paths.

    Paths come from the root given to `add_root` (empty string for the root
    itself); a module seen first without a known root is named by its class,
    and its children below it (`ResNet.layer1.0.relu`).
    """

    def __init__(self) -> None:
        # id(module) -> (weakref to it, dotted path, class name); the weakref
        # tells a live module from a dead one whose id was reused.
        self._known: dict[int, tuple[Any, str, str]] = {}
        self._calls: dict[int, int] = {}
        self._stack: list[tuple[torch.nn.Module, ModuleContext]] = []
        #: The innermost running module's context (None outside any module); an
        #: attribute, not a property: it is read on every saved tensor.
        self.current: ModuleContext | None = None
        self._on_stack: dict[int, int] = {}  # id(module) -> its index in _stack
        self._handles: list[Any] = []
        #: Called with (module, args) when a module is called from outside any
        #: module, and with (module, None) when that call returns.
        self.on_top_level: Any = None
        self._buffer_ids: set[int] | None = None

    def add_root(
        self, module: torch.nn.Module, prefix: str = "", named: list[tuple[str, torch.nn.Module]] | None = None
    ) -> None:
        """Name `module` and its submodules; `named` is `list(module.named_modules())` if the caller has it."""
        for name, sub in named if named is not None else module.named_modules(remove_duplicate=True):
            if self._lookup(sub) is None:
                path = f"{prefix}.{name}" if prefix and name else (prefix or name)
                self._known[id(sub)] = (weakref.ref(sub), path, type(sub).__name__)

    def buffer_ids(self) -> set[int]:
        """ids of the registered buffers of every known module (cached per outermost call)."""
        if self._buffer_ids is None:
            ids: set[int] = set()
            for ref, _, _ in self._known.values():
                module = ref()
                if module is not None:
                    ids.update(id(b) for b in module._buffers.values() if b is not None)
            self._buffer_ids = ids
        return self._buffer_ids

    def path_of(self, module: torch.nn.Module) -> str:
        """`model`, `model.layer1` for a known root; the class name for a module never seen."""
        entry = self._lookup(module)
        if entry is None:
            return type(module).__name__
        return f"model.{entry[1]}" if entry[1] else "model"

    def _lookup(self, module: torch.nn.Module) -> tuple[Any, str, str] | None:
        entry = self._known.get(id(module))
        return entry if entry is not None and entry[0]() is module else None

    def _learn(self, module: torch.nn.Module) -> tuple[Any, str, str]:
        """A module first seen outside any known root: named by its class."""
        refuse_opaque(module, type(module).__name__)
        self.add_root(module, type(module).__name__)
        return self._known[id(module)]

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        stack = self._stack
        key = id(module)
        stale = self._on_stack.get(key)
        if stale is not None:
            # Entered again while still on the stack: an exception unwound past
            # its post hook (or, rarely, a module calls itself). Drop the stale part.
            self._truncate(stale)
        if not stack:
            self._calls.clear()
            self._buffer_ids = None
            if self.on_top_level is not None:
                self.on_top_level(module, args)
        entry = self._known.get(key)
        if entry is None or entry[0]() is not module:
            entry = self._learn(module)
        call = self._calls.get(key, 0) + 1
        self._calls[key] = call
        # __dict__, not getattr: Module.__getattr__ raises internally for most modules.
        inplace = module.__dict__.get("inplace")
        self._on_stack[key] = len(stack)
        context = self.current = (entry[1], call, entry[2], inplace if isinstance(inplace, bool) else None)
        stack.append((module, context))

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        index = self._on_stack.get(id(module))
        if index is not None:
            self._truncate(index)
            if index == 0 and self.on_top_level is not None:
                self.on_top_level(module, None)

    def _truncate(self, index: int) -> None:
        stack = self._stack
        while len(stack) > index:
            top, _ = stack.pop()
            self._on_stack.pop(id(top), None)
        self.current = stack[-1][1] if stack else None

    def clear(self) -> None:
        """Forget modules an exception unwound past (their post hooks never ran)."""
        self._truncate(0)

    def __enter__(self) -> "ModuleTracker":
        # Not always_call=True: it slows every module call several-fold. An
        # exception instead leaves the stack as it was at the error: exactly
        # the context an error message needs; `clear()` forgets it.
        mm = torch.nn.modules.module
        self._handles = [
            mm.register_module_forward_pre_hook(self._pre),
            mm.register_module_forward_hook(self._post),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.clear()
