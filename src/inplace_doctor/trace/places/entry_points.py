"""Calls into a model that no forward hook sees: a module class's own `__call__`, a bare `forward`.

PyTorch runs the global forward hooks that `modules.py` keeps its module stack with only inside
`nn.Module.__call__`. A class that overrides `__call__` (model zoos do, for rollouts) and a
`model.forward(x)` called directly (by a wrapper that is no module) run the model's code with no
hook: a write into the tensor its caller passed was not taken for a write into the caller's input
(IPD106), nor named in the module. So while a session runs, such a class's own `__call__` and
`forward` are wrapped on the class (process-wide, `shared_patches.py`; the wrapper keeps
`__wrapped__`, so `inspect.signature` reads the program's), and a call of one enters the calling
thread's sessions' module stacks as a hooked call does (`ModulePaths.call_entered`): the arguments
of an outermost one are the caller's inputs. A `forward` that `nn.Module.__call__` runs, or that
the class's own `__call__` calls, is inside that call already and adds nothing.

Which classes: those of the modules a session is given (`watch(model)`, `audit(model)`: the
model's and its submodules'), of a module that gets a submodule while the session runs (a model
a script under `run` builds), and of a module first met running (from its next call on); only
classes defined outside torch: torch's own modules are called, not run by `forward`.

Known limitations: a class whose instances the session never meets that way (a model built before
a `watch()` that is not given it, without submodules or never called through `nn.Module.__call__`)
runs unseen. An instance attribute `forward` or `__call__` set by the program runs without the
wrapper, and so does a function another library already wrapped (it has `__wrapped__`: transformers'
checkpointing layers compare `type(self).forward` with their own wrapper). While a session runs, `type(model).forward` is the wrapper (`is` comparisons with the
function the class defines are False; `__wrapped__` holds it).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
import types
from typing import Any

import torch

from ..process.shared_patches import SharedPatch
from ..raised.blame import passed_through
from .modules import ModulePaths

#: (the class that defines the function, its name) -> the one patch of it, shared by all sessions
_PATCHES: dict[tuple[type, str], SharedPatch[ModulePaths]] = {}
#: a module class -> the patches of the functions its calls enter by (none for most)
_OF_CLASS: dict[type, tuple[SharedPatch[ModulePaths], ...]] = {}
_MAKING = threading.Lock()
os.register_at_fork(after_in_child=_MAKING._at_fork_reinit)  # type: ignore[attr-defined]  # as logging's locks


def _defining(cls: type, name: str) -> type | None:
    """The class of `cls`'s method resolution order that defines `name`, below `nn.Module`."""
    for klass in cls.__mro__:
        if klass is torch.nn.Module:
            return None
        if name in klass.__dict__:
            return klass
    return None


def _torchs(cls: type) -> bool:
    module = cls.__module__
    return module == "torch" or module.startswith("torch.")


def _patches_of(cls: type) -> tuple[SharedPatch[ModulePaths], ...]:
    found = _OF_CLASS.get(cls)
    if found is not None:
        return found
    with _MAKING:  # one patch per function, whichever threads' sessions ask first
        return _make_patches(cls)


def _make_patches(cls: type) -> tuple[SharedPatch[ModulePaths], ...]:
    patches = []
    for name in ("__call__", "forward"):
        owner = _defining(cls, name)
        if owner is None or _torchs(owner):
            continue  # torch's own modules are entered by `nn.Module.__call__` (`OptimizedModule`'s too)
        if not isinstance(owner.__dict__[name], types.FunctionType):
            continue  # a staticmethod, a C function: called as it is
        if hasattr(owner.__dict__[name], "__wrapped__"):
            # another library's wrapper, which may check that it is the one in place: transformers'
            # checkpointing layers checkpoint only `if type(self).forward is forward_with_checkpointing`
            continue
        key = (owner, name)
        if key not in _PATCHES:
            _PATCHES[key] = _entry_patch(owner, name)
        patches.append(_PATCHES[key])
    found = _OF_CLASS[cls] = tuple(patches)
    return found


def _entry_patch(owner: type, name: str) -> SharedPatch[ModulePaths]:
    bare = name == "forward"
    patch: SharedPatch[ModulePaths]

    def wrap(original: Any) -> Any:
        if not isinstance(original, types.FunctionType):
            return None  # another tool's patch is there

        @functools.wraps(original)
        def entry(self: Any, *args: Any, **kwargs: Any) -> Any:
            sessions = patch.here()
            if not sessions or not isinstance(self, torch.nn.Module):
                return original(self, *args, **kwargs)
            depths = [(paths, paths.call_entered(self, args, kwargs, bare)) for paths in sessions]
            try:  # an error leaves the stack as a hooked call's does: where it was raised, for its report
                output = original(self, *args, **kwargs)
            except BaseException as exc:
                passed_through(exc)  # the program's (a wrong argument), not the tool's crash
                raise
            for paths, depth in reversed(depths):
                paths.call_left(self, depth, output)
            return output

        return entry

    patch = SharedPatch(owner, name, wrap)
    return patch


def _unhooked_caller(frame: Any, older: set[int]) -> torch.nn.Module | None:
    """The outermost module whose own `__call__` or `forward` runs in `frame` or its callers, while
    no forward hook has entered any module (so none of them was entered by one), below the frames
    `older` (ids of those that ran when the session began: a `watch()` opened inside a forward)."""
    found = None
    depth = 0
    while frame is not None and depth < 64 and id(frame) not in older:
        code = frame.f_code
        if code.co_name in ("__call__", "forward") and "self" in code.co_varnames:
            owner = frame.f_locals.get("self")
            function = getattr(type(owner), code.co_name, None) if isinstance(owner, torch.nn.Module) else None
            if function is not None and getattr(inspect.unwrap(function), "__code__", None) is code:
                found = owner
        frame, depth = frame.f_back, depth + 1
    return found


class EntryPoints:
    """A session's wrapped entry functions: those of the classes of the modules it is given, that get
    a submodule while it runs, or that it meets running."""

    def __init__(self, modules: ModulePaths) -> None:
        self._modules = modules
        self._classes: set[type] = set()
        self._held: list[SharedPatch[ModulePaths]] = []
        self._thread = 0
        self._handle: Any = None
        #: classes whose calls ran model code unseen before the session met them (class names)
        self.late: list[str] = []
        self._older: list[Any] = []  # the frames that ran when it began, held so their ids stay theirs

    def __enter__(self) -> EntryPoints:
        self._thread = threading.get_ident()
        frame: Any = sys._getframe(1)
        self._older = []
        while frame is not None and len(self._older) < 64:
            self._older.append(frame)
            frame = frame.f_back
        for cls in list(self._modules.classes):
            self.want(cls)
        register = getattr(torch.nn.modules.module, "register_module_module_registration_hook", None)
        if register is not None:
            self._handle = register(self._registered)
        self._modules.on_learn = self._learned
        return self

    def want(self, cls: type) -> None:
        """Calls of `cls`'s own `__call__` and `forward` enter the session's module stack from now on."""
        if cls in self._classes:
            return
        self._classes.add(cls)
        for patch in _patches_of(cls):
            if patch not in self._held:
                patch.acquire(self._modules)
                self._held.append(patch)

    def _registered(self, parent: torch.nn.Module, name: str, submodule: Any) -> None:
        if threading.get_ident() == self._thread:  # a patch is acquired for the thread that runs it
            self.want(type(parent))
            if isinstance(submodule, torch.nn.Module):
                self.want(type(submodule))

    def _learned(self, module: torch.nn.Module) -> None:
        if threading.get_ident() != self._thread:
            return
        self.want(type(module))
        if self._modules.current is None:  # an outermost call: is it made by a model's own unhooked code?
            caller = _unhooked_caller(sys._getframe(2), {id(f) for f in self._older})
            if caller is not None and type(caller) not in self._classes:
                self.want(type(caller))
                self.late.append(type(caller).__name__)

    def note(self) -> str | None:
        """The report's line when a class's calls ran unseen before the session met it."""
        if not self.late:
            return None
        late = sorted(set(self.late))
        names, them = ", ".join(f"`{name}`" for name in late), "them" if len(late) > 1 else "it"
        return (
            f"{names} ran model code outside nn.Module.__call__ (a class's own __call__, or forward called "
            f"directly) before the session met {them}: writes into its callers' tensors (IPD106) were looked for only from its "
            "next call on; give the model to the session (watch(model)) to see every call"
        )

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self._modules.on_learn = None
        self._older = []
        held, self._held = self._held, []
        for patch in reversed(held):
            patch.release(self._modules)
        self._classes = set()


__all__ = ["EntryPoints"]
