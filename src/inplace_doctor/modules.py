"""The module path active at each op, named like `model.named_modules()` does."""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

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
        self._names: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._calls: dict[int, int] = {}
        self._stack: list[tuple[torch.nn.Module, ModuleContext]] = []
        self._handles: list[Any] = []
        self.error_context: ModuleContext | None = None
        self._error_seen: BaseException | None = None

    def add_root(self, module: torch.nn.Module, prefix: str = "") -> None:
        for name, sub in module.named_modules(remove_duplicate=True):
            if sub not in self._names:
                self._names[sub] = f"{prefix}.{name}" if prefix and name else (prefix or name)

    def _name_of(self, module: torch.nn.Module) -> str:
        name = self._names.get(module)
        if name is None:
            refuse_opaque(module, type(module).__name__)
            self.add_root(module, type(module).__name__)
            name = self._names[module]
        return name

    @property
    def current(self) -> ModuleContext | None:
        return self._stack[-1][1] if self._stack else None

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if not self._stack:
            self._calls.clear()
        key = id(module)
        call = self._calls.get(key, 0) + 1
        self._calls[key] = call
        inplace = getattr(module, "inplace", None)
        ctx = (self._name_of(module), call, type(module).__name__, inplace if isinstance(inplace, bool) else None)
        self._stack.append((module, ctx))

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        exc = sys.exc_info()[1]
        if exc is not None and exc is not self._error_seen and self._stack:
            # The innermost module still running when an exception unwinds.
            self._error_seen = exc
            self.error_context = self._stack[-1][1]
        while self._stack:
            top, _ = self._stack.pop()
            if top is module:
                break

    def __enter__(self) -> "ModuleTracker":
        mm = torch.nn.modules.module
        self._handles = [
            mm.register_module_forward_pre_hook(self._pre),
            mm.register_module_forward_hook(self._post, always_call=True),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._stack.clear()
