"""The module path active at each op, named like `model.named_modules()` does."""

from __future__ import annotations

import functools
import sys
import weakref
from typing import Any

import torch

from ... import _compat
from ...errors import UnsupportedModuleError
from ...sites import ROOT_LABEL, module_path
from ..process.compiled import COMPILED_WRAPPER, uncompiled, without_compiled_wrappers
from ..saves.storage import storage_key
from .user_names import variable_name

ModuleContext = tuple[str, int, str, "bool | None"]  # path, call index, class, inplace flag
_current_graph_task_id = _compat.current_graph_task_id


class _Known:
    """A module the tracer has named, and where it is in the running outermost call: one lookup
    per module call finds all of it (its calls counted, its place on the stack kept, in place)."""

    __slots__ = ("ref", "path", "cls", "calls", "epoch", "depth", "entered")

    def __init__(self, ref: Any, path: str, cls: str) -> None:
        self.ref = ref  # tells a live module from a dead one whose id was reused
        self.path = path
        self.cls = cls
        self.calls = 0  # calls in the outermost call numbered `epoch`
        self.epoch = 0
        self.depth = -1  # its index on the module stack, -1 when not on it
        self.entered = False  # put there by `call_entered`, not by the forward hooks


def refuse_opaque(module: torch.nn.Module, where: str) -> None:
    """Refuse a module whose ops the tracer cannot see (TorchScript); `torch.compile`d ones run eagerly."""
    if isinstance(module, torch.jit.ScriptModule):
        raise UnsupportedModuleError(
            f"{where} is a TorchScript module ({type(module).__name__}); inplace-doctor traces eager "
            "PyTorch only: pass the original nn.Module instead of torch.jit.script/trace output."
        )


class ModulePaths:
    """Global forward hooks keeping the stack of running modules: path, call index, class, inplace flag.

    Unlike `torch.utils.module_tracker.ModuleTracker` (the fully qualified
    names of the modules running, forward or backward), it gives each op a
    `ModuleContext`: the innermost module's path, its call index (counted
    from the start of the outermost module call), its class and its
    `inplace` flag.

    Paths come from the root given to `add_root` (empty string for the root
    itself); a module seen first without a known root is named by its class,
    and its children below it (`ResNet.layer1.0.relu`).
    """

    def __init__(self) -> None:
        # id(module) -> what is known of it (`_Known`: its weakref tells a live module from a dead
        # one whose id was reused)
        self._known: dict[int, _Known] = {}
        #: What reports call the root added without a prefix (`model`; a `watch(policy=net)` sets
        #: `policy`): `path_of` names that root's modules under it, and every other one by its path.
        self.root_label = ROOT_LABEL
        self._under_root: set[int] = set()  # ids of the modules added by `add_root` without a prefix
        self._epoch = 0  # outermost calls so far: a module's call index restarts at each
        self._stack: list[tuple[torch.nn.Module, _Known, ModuleContext]] = []
        #: The innermost running module's context (None outside any module); an
        #: attribute, not a property: it is read on every saved tensor.
        self.current: ModuleContext | None = None
        self._handles: list[Any] = []
        #: Called with (module, args, kwargs) when a module is called from outside
        #: any module, and with (module, None, None) when that call returns.
        self.on_top_level: Any = None
        #: Called with what an outermost call returned, just before `on_top_level(module, None, None)`.
        self.on_top_level_output: Any = None
        self._buffer_ids: set[int] | None = None
        # storage key -> (weakref to the parameter or buffer, its qualified name); built when a finding needs it
        self._state_names: dict[int, tuple[Any, str]] | None = None
        #: class names of the TorchScript modules met while running (their ops are seen, not their lines)
        self.scripted: list[str] = []
        #: the classes of the modules named so far (`entry_points.py` wraps their own `__call__`, `forward`)
        self.classes: set[type] = set()
        #: called with each module first met while running (`_learn`)
        self.on_learn: Any = None
        #: backward graph task -> the stack's depth when a module first ran inside it (a checkpoint's
        #: recompute); the task's end truncates back to it (`_end_of_backward`)
        self._backward_depths: dict[int, int] = {}

    def add_root(
        self, module: torch.nn.Module, prefix: str = "", named: list[tuple[str, torch.nn.Module]] | None = None
    ) -> None:
        """Name `module` and its submodules; `named` is `list(module.named_modules())` if the caller has it."""
        known, under_root, ref, classes = self._known, self._under_root, weakref.ref, self.classes
        for name, sub in named if named is not None else named_modules(module):
            classes.add(type(sub))
            key = id(sub)
            entry = known.get(key)
            if entry is not None and entry.ref() is sub:
                continue
            if COMPILED_WRAPPER in name:
                name = without_compiled_wrappers(name)
            path = f"{prefix}.{name}" if prefix and name else (prefix or name)
            known[key] = _Known(ref(sub), path, type(sub).__name__)
            if prefix:
                under_root.discard(key)  # the id of a dead root module, reused
            else:
                under_root.add(key)
        self._state_names = None

    def buffer_ids(self) -> set[int]:
        """ids of the registered buffers of every known module (cached per outermost call)."""
        if self._buffer_ids is None:
            ids: set[int] = set()
            for entry in self._known.values():
                module = entry.ref()
                if module is not None:
                    ids.update(id(b) for b in module._buffers.values() if b is not None)
            self._buffer_ids = ids
        return self._buffer_ids

    def state_name(self, t: torch.Tensor) -> str | None:
        """The qualified name (`2.weight`, `D.2.weight`) of the known module's parameter or buffer
        whose memory `t` is (the parameter itself, its `.data`, a `state_dict()` entry), or None."""
        key = storage_key(t)
        if not key:
            return None
        names = self._state_names
        if names is None or (key not in names and isinstance(t, torch.nn.Parameter)):
            names = self._state_names = self._collect_state_names()
        entry = names.get(key)
        if entry is None:
            return None
        owner = entry[0]()
        if owner is None or storage_key(owner) != key:  # rebound since (`p.data = ...`)
            self._state_names = None
            return None
        return entry[1]

    def _collect_state_names(self) -> dict[int, tuple[Any, str]]:
        names: dict[int, tuple[Any, str]] = {}
        for entry in list(self._known.values()):
            module, path = entry.ref(), entry.path
            if module is None:
                continue
            for table in (module._parameters, module._buffers):
                for name, value in table.items():
                    if isinstance(value, torch.Tensor):
                        key = storage_key(value)
                        if key and key not in names:
                            names[key] = (weakref.ref(value), f"{path}.{name}" if path else name)
        return names

    def current_origin(self, search_files: tuple[str, ...] = ()) -> Any:
        """Where the innermost running module (one with an `inplace` flag) was constructed: a `Frame` or None."""
        if not self._stack:
            return None
        module, _, (path, _, _, _) = self._stack[-1]
        return self.origin_for(module, path, search_files)

    def current_module(self) -> torch.nn.Module | None:
        return self._stack[-1][0] if self._stack else None

    def origin_for(self, module: torch.nn.Module, path: str, search_files: tuple[str, ...] = ()) -> Any:
        """`current_origin` for a module known by its path (resolved later than the call)."""
        from .origins import origin_of

        parent_path, _, name = path.rpartition(".")
        parent = self._by_path(parent_path) if path else None
        grand_path, _, parent_name = parent_path.rpartition(".")
        grandparent = self._by_path(grand_path) if parent_path else None
        return origin_of(module, parent, name, grandparent, parent_name, search_files)

    def _by_path(self, path: str) -> torch.nn.Module | None:
        for entry in list(self._known.values()):
            if entry.path == path:
                module = entry.ref()
                if module is not None:
                    return uncompiled(module)  # the wrapper and the module it wraps share a path
        return None

    def path_of(self, module: torch.nn.Module) -> str:
        """As the user writes it: `model`, `model.layer1` under the unnamed root; `D.0` under a root
        named `D` or for a module learned from the user's variable; the class for one never seen."""
        entry = self._lookup(module)
        if entry is None:
            return type(module).__name__
        if id(module) in self._under_root and self.root_label:
            return module_path(entry.path, self.root_label)
        return entry.path or type(module).__name__

    def _lookup(self, module: torch.nn.Module) -> _Known | None:
        entry = self._known.get(id(module))
        return entry if entry is not None and entry.ref() is module else None

    def _learn(self, module: torch.nn.Module) -> _Known:
        """A module first seen outside any known root: named by the user's variable that holds it
        (`D` for `D = nn.Sequential(...)`; two `Sequential`s are then told apart), else by its class."""
        if isinstance(module, torch.jit.ScriptModule):
            # Met while running (a script under `run`): its ops still reach the dispatch mode, but
            # TorchScript keeps no Python frames; the report says so instead of stopping a correct program.
            self.scripted.append(getattr(module, "original_name", None) or type(module).__name__)
        taken = {entry.path for entry in self._known.values()}
        name = variable_name(module)
        if name in taken:
            name = None  # a name now bound to another module than the one it named first
        self.add_root(module, unique_label(name or type(module).__name__, taken))
        if self.on_learn is not None:
            self.on_learn(module)
        return self._known[id(module)]

    def call_entered(self, module: torch.nn.Module, args: Any, kwargs: dict[str, Any], bare: bool) -> int:
        """A call of `module` no forward hook sees (its class's own `__call__`; with `bare`, its
        `forward` called directly, `model.forward(x)`) begins: as `_pre` does. Its depth on the
        stack, for `call_left`; -1 for a `forward` run by the module's own call, entered already."""
        stack = self._stack
        if bare and stack and stack[-1][0] is module:
            return -1
        entry = self._lookup(module)
        if entry is not None and entry.depth >= 0:
            self._truncate(entry.depth)  # left there by an exception
        self._pre(module, args, kwargs)
        entry = self._known[id(module)]
        entry.entered = True
        return entry.depth

    def call_left(self, module: torch.nn.Module, depth: int, output: Any) -> None:
        """The call `call_entered` began returned `output`."""
        stack = self._stack
        if depth < 0 or depth >= len(stack) or stack[depth][0] is not module:
            return  # not entered, or forgotten since (the end of a backward that ran it)
        if depth == 0:
            self._top_level_returned(module, output)
        else:
            self._truncate(depth)

    def _pre(self, module: torch.nn.Module, args: Any, kwargs: dict[str, Any] | None = None) -> None:
        # Runs at every module call: a lookup, a count and two small tuples; no frame is walked
        # unless the module is met for the first time in this session (`_learn`).
        stack = self._stack
        if _current_graph_task_id() != -1:
            self._in_backward()
        entry = self._known.get(id(module))
        if entry is not None and entry.depth >= 0:
            if entry.entered and entry.depth == len(stack) - 1:
                return  # `super().__call__(x)` inside its class's own `__call__`, entered already
            # Entered again while still on the stack (which holds it, so it is this module): an
            # exception unwound past its post hook (or, rarely, a module calls itself). Drop the stale part.
            self._truncate(entry.depth)
        if not stack:
            self._top_level_call(module, args, kwargs)
        if entry is None or entry.ref() is not module:
            entry = self._learn(module)
        if entry.epoch != self._epoch:
            entry.epoch, entry.calls = self._epoch, 0
        call = entry.calls = entry.calls + 1
        # __dict__, not getattr: Module.__getattr__ raises internally for most modules.
        inplace = module.__dict__.get("inplace")
        entry.depth, entry.entered = len(stack), False
        context = self.current = (entry.path, call, entry.cls, inplace if inplace is True or inplace is False else None)
        stack.append((module, entry, context))

    def _in_backward(self) -> None:
        task = _current_graph_task_id()
        if task not in self._backward_depths:  # a module run by backward: a recompute
            self._backward_depths[task] = len(self._stack)
            _compat.queue_backward_callback(functools.partial(self._end_of_backward, task))

    def _top_level_call(self, module: torch.nn.Module, args: Any, kwargs: dict[str, Any] | None) -> None:
        self._epoch += 1
        self._buffer_ids = None
        if self.on_top_level is not None:
            if kwargs is None:  # read in the frame of the module's `_call_impl`, past this one and `_pre`
                kwargs = _compat.forward_call_kwargs(module, sys._getframe(2))
            self.on_top_level(module, args, kwargs)

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        entry = self._known.get(id(module))
        if entry is None:
            return
        index = entry.depth
        if entry.entered and index == len(self._stack) - 1:
            return  # the `super().__call__(x)` of an entered call: `call_left` ends it
        if index <= 0:
            if index == 0:
                self._top_level_returned(module, output)
            return
        stack = self._stack
        if len(stack) == index + 1:  # the innermost module returns: the usual case
            stack.pop()
            entry.depth = -1
            self.current = stack[-1][2]
        else:
            self._truncate(index)

    def _top_level_returned(self, module: torch.nn.Module, output: Any) -> None:
        self._truncate(0)
        if self.on_top_level_output is not None:
            self.on_top_level_output(output)
        if self.on_top_level is not None:
            self.on_top_level(module, None, None)

    def _truncate(self, index: int) -> None:
        stack = self._stack
        while len(stack) > index:
            entry = stack.pop()[1]
            entry.depth, entry.entered = -1, False
        self.current = stack[-1][2] if stack else None

    def _end_of_backward(self, task: int) -> None:
        """A backward pass that ran modules ended: forget those still on the stack. A checkpoint's
        recompute stops early (`_StopRecomputationError`) once it has what backward needs, unwinding
        past the post hooks of the modules it was in; left there, they would name the optimizer's
        writes after backward ("in block.fc2") and hide the next forward's top-level call."""
        depth = self._backward_depths.pop(task, None)
        if depth is None or len(self._stack) <= depth:
            return
        bottom = self._stack[0][0]
        self._truncate(depth)
        if depth == 0 and self.on_top_level is not None:
            self.on_top_level(bottom, None, None)  # as `_post` says when a top-level call returns

    def clear(self) -> None:
        """Forget modules an exception unwound past (their post hooks never ran)."""
        self._truncate(0)
        self._backward_depths.clear()

    def __enter__(self) -> ModulePaths:
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


_NAMED_MODULES = torch.nn.Module.named_modules


def named_modules(root: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """`list(root.named_modules())`, walked without a generator per module (a third of the time):
    the same names in the same order, each module once. A tree with a class of its own
    `named_modules` is asked as PyTorch would."""
    found: list[tuple[str, torch.nn.Module]] = []
    seen: set[torch.nn.Module] = set()
    todo: list[tuple[str, torch.nn.Module]] = [("", root)]
    while todo:
        prefix, module = todo.pop()
        if module in seen:
            continue
        if type(module).named_modules is not _NAMED_MODULES:
            return list(root.named_modules())
        seen.add(module)
        found.append((prefix, module))
        children = module._modules
        if children:
            dot = prefix + "." if prefix else ""
            todo.extend(reversed([(dot + name, sub) for name, sub in children.items() if sub is not None]))
    return found


def unique_label(name: str, taken: set[str]) -> str:
    """`name`, or `name#2`, `name#3` ... when taken: two roots of one class are never one path."""
    label, n = name, 1
    while label in taken:
        n += 1
        label = f"{name}#{n}"
    return label
