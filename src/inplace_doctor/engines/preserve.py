"""Leave the user's model, inputs and RNG exactly as they were found."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import random
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import torch

from .._compat import set_versions
from ..errors import UsageError
from ..trace.saves.storage import storage_span
from .attributes import PlainAttributes

T = TypeVar("T")


def tensors_in(value: Any) -> list[torch.Tensor]:
    """Tensors inside nested lists, tuples, dicts (and dict-like model outputs) and dataclasses."""
    return _found_in(value, torch.Tensor)


def generators_in(value: Any) -> list[torch.Generator]:
    """The `torch.Generator`s inside nested lists, tuples, dicts and dataclasses (a model's input)."""
    return _found_in(value, torch.Generator)


def _found_in(value: Any, kind: type[T]) -> list[T]:
    """The `kind` objects inside nested containers (`_items`); a tensor is not looked into."""
    found: list[T] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, kind):
            found.append(item)
        elif not isinstance(item, torch.Tensor):
            stack.extend(value for _, value in _items(item))
    return found


def _items(value: Any) -> list[tuple[str, Any]]:
    """(label, value) of each item of a container the walks look into; [] for anything else.
    A dataclass instance is a container of its fields (a batch as users write it)."""
    if isinstance(value, dict):
        return [(f"[{k!r}]", v) for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [(f"[{i}]", v) for i, v in enumerate(value)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(f".{f.name}", getattr(value, f.name)) for f in dataclasses.fields(value) if hasattr(value, f.name)]
    return []


def private_inputs(value: Any) -> Any:
    """The caller's inputs, with each non-leaf tensor that requires grad replaced
    by a private non-leaf copy: backward then stops at the audited model instead
    of running into (and freeing) the caller's graph, and an in-place write by
    the model cannot rebase the caller's tensor's history. Copies of inputs that
    share memory are views of one private copy, so they still alias. Leaves and
    tensors without grad are passed as they are (audit snapshots them before a write)."""
    bases: dict[int, torch.Tensor] = {}

    def private(t: torch.Tensor) -> torch.Tensor:
        if not (t.requires_grad and not t.is_leaf):
            return t
        storage = t.untyped_storage()
        base = bases.get(storage.data_ptr())
        if base is None or base.dtype != t.dtype:
            with torch.no_grad():
                flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(storage)
                leaf = flat.clone()
            with torch.enable_grad():  # also when called under no_grad (run --verify records inputs so)
                base = leaf.requires_grad_(True).clone()  # non-leaf, like the caller's tensor
            bases[storage.data_ptr()] = base
        with torch.enable_grad():
            return base.as_strided(t.shape, t.stride(), t.storage_offset())

    return map_tensors(value, private)


def private_copy(value: Any) -> Any:
    """The caller's inputs copied for a run of the tool's own (verify, memory, optimize): a deep
    copy, so that inputs sharing memory still share it and every other object in them (a
    `torch.Generator`, a batch object) is the run's own. Two exceptions: a non-leaf tensor that
    requires grad stays a non-leaf (deepcopy refuses one; `private_inputs` makes its copy), and
    an inference tensor stays one (deepcopy makes a normal tensor, which autograd may save)."""
    privates = private_inputs(value)
    memo: dict[int, Any] = {id(t): t for t in tensors_in(privates) if t.requires_grad and not t.is_leaf}
    copies = copy.deepcopy(privates, memo)
    inference = {id(c): t for t, c in zip(tensors_in(value), tensors_in(copies)) if t.is_inference()}
    if inference:
        copies = map_tensors(copies, lambda c: clone_keeping_inference(inference[id(c)]) if id(c) in inference else c)
    return copies


def private_copies(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`private_copy` of a call's arguments, copied together (an alias across them is kept)."""
    copied_args, copied_kwargs = private_copy((args, kwargs))
    return copied_args, copied_kwargs


def clone_keeping_inference(t: torch.Tensor) -> torch.Tensor:
    """`t.detach().clone()`, still an inference tensor when `t` is one: a plain clone outside
    `torch.inference_mode()` is a normal tensor, and would hide the error PyTorch raises when
    autograd must save an inference tensor for backward."""
    if t.is_inference():
        with torch.inference_mode():
            return t.clone()
    return t.detach().clone()


def refuse_meta(
    model: torch.nn.Module, inputs: Iterable[torch.Tensor], job: str, modules: list[torch.nn.Module] | None = None
) -> None:
    """Raise `UsageError` when the model or an input is on the meta device: no values to
    compare or measure, and no memory (every meta tensor reports address 0, so the overlap
    checks would see one storage). `modules`: `list(model.modules())` if the caller has it."""
    inputs = list(inputs)
    meta = next((t for t in itertools.chain(_own_tensors(model, modules), inputs) if t.is_meta), None)
    if meta is None:
        return
    # named only now: naming walks the tree again
    named = itertools.chain(model.named_parameters(), model.named_buffers())
    what = next((f"{type(model).__name__}.{name}" for name, t in named if t is meta), "an input")
    raise UsageError(
        f"{job} needs real tensors, but {what} is on the meta device (shapes only: no values, no memory); "
        "build the model on cpu, e.g. `model.to_empty(device='cpu')` and initialise it, with a small input"
    )


def _own_tensors(model: torch.nn.Module, modules: list[torch.nn.Module] | None) -> Iterator[torch.Tensor]:
    """The model's parameters and buffers: read from `modules`' tables where the model names them
    the usual way (no walk of the tree), else as the model lists them."""
    cls = type(model)
    if modules is None or cls.named_parameters is not _NAMED_PARAMETERS or cls.named_buffers is not _NAMED_BUFFERS:
        return itertools.chain(model.parameters(), model.buffers())
    return (t for module in modules for table in (module._parameters, module._buffers) for t in table.values() if t is not None)


_NAMED_PARAMETERS, _NAMED_BUFFERS = torch.nn.Module.named_parameters, torch.nn.Module.named_buffers


def map_tensors(value: Any, fn: Any) -> Any:
    """`fn` applied to every tensor in nested lists, tuples (named too), dicts (OrderedDict too)
    and dataclasses. A dataclass whose fields all map to themselves is returned as it is, else a
    shallow copy with the new fields (set past a frozen dataclass's `__setattr__`)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        items = [(k, map_tensors(v, fn)) for k, v in value.items()]
        try:
            return type(value)(items)
        except Exception:  # a mapping type that cannot be rebuilt: leave it as it is
            return value
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(map_tensors(v, fn) for v in value))
    if isinstance(value, (list, tuple)):
        try:
            return type(value)(map_tensors(v, fn) for v in value)
        except Exception:
            return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _map_dataclass(value, fn)
    return value


def _map_dataclass(value: Any, fn: Any) -> Any:
    """`map_tensors` of a dataclass instance: itself when every field maps to itself, else a
    shallow copy with the new fields (set past a frozen dataclass's `__setattr__`)."""
    changed = {}
    for f in dataclasses.fields(value):
        if hasattr(value, f.name):
            old = getattr(value, f.name)
            new = map_tensors(old, fn)
            if new is not old:
                changed[f.name] = new
    if not changed:
        return value
    rebuilt = copy.copy(value)
    for name, new in changed.items():
        object.__setattr__(rebuilt, name, new)
    return rebuilt


def labelled_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """Every tensor in a call's arguments with its path: `args[0]`, `kwargs['mask']`, `args[1][0]`,
    `args[0].features` (a dataclass's field)."""
    found: list[tuple[str, torch.Tensor]] = []

    def walk(value: Any, path: str) -> None:
        if isinstance(value, torch.Tensor):
            found.append((path, value))
        else:
            for label, item in _items(value):
                walk(item, path + label)

    for i, a in enumerate(args):
        walk(a, f"args[{i}]")
    for k, v in kwargs.items():
        walk(v, f"kwargs[{k!r}]")
    return found


class RngState:
    """torch (CPU and initialised CUDA), Python `random` and numpy generators; and `generators`,
    the user's own `torch.Generator`s (a model's attribute, an input)."""

    def __init__(self, generators: Iterable[torch.Generator] = ()) -> None:
        self.generators = [(g, g.get_state()) for g in {id(g): g for g in generators}.values()]
        self.torch = torch.random.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self.python = random.getstate()
        # Only once numpy.random is imported: `numpy.random` on numpy alone would import it
        # (a side effect of ours), and before that import no code has drawn from it.
        random_module = sys.modules.get("numpy.random")
        self.numpy = random_module.get_state() if random_module is not None else None

    def restore(self) -> None:
        for generator, state in self.generators:
            generator.set_state(state)
        torch.random.set_rng_state(self.torch)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        random.setstate(self.python)
        if self.numpy is not None:
            numpy = sys.modules["numpy"]
            now = numpy.random.get_state()  # reading is cheaper than writing 624 words back
            if now[2:] != self.numpy[2:] or not numpy.array_equal(now[1], self.numpy[1]):
                numpy.random.set_state(self.numpy)
        # numpy.random imported during the run starts from fresh OS entropy: nothing to restore.


class Preserved:
    """Context manager: run a model and leave no trace on it.

    Buffers are swapped for clones during the run (BatchNorm writes its
    running statistics without any visible write); existing `.grad` tensors
    are set aside and put back (None stays None); parameters, inputs and tensors
    the modules hold as plain attributes are snapshotted just before the first
    write the tracer sees to them, and written back only then; train/eval flags,
    each parameter's and leaf input's `requires_grad`, the global RNGs and the
    user's `torch.Generator`s (`generators`: the inputs'; the modules' own are
    found) are restored; plain attributes are put back where they hold tensors
    (attributes.py). Not restored: the module structure (submodules, hooks)
    and attributes that hold no tensor.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        inputs: Iterable[torch.Tensor],
        modules: list[torch.nn.Module] | None = None,
        generators: Iterable[torch.Generator] = (),
    ) -> None:
        self.model = model
        self._modules = modules  # model.modules(), when the caller has walked the tree already
        self.inputs = list(inputs)
        self._generators = list(generators)
        self._protected: dict[int, list[torch.Tensor]] | None = None  # storage pointer -> the tensors on it
        # storage pointer -> (storage, its bytes, the version of each protected tensor on it before the write)
        self._snapshots: dict[int, tuple[Any, Any, list[tuple[torch.Tensor, int]]]] = {}

    def __enter__(self) -> Preserved:
        model = self.model
        modules = self._modules if self._modules is not None else list(model.modules())  # one walk serves all below
        self._parameters = [
            (module, name, p) for module in modules for name, p in module._parameters.items() if p is not None
        ]
        self._training = [(m, m.training) for m in modules]
        self._attributes = PlainAttributes(modules)
        self._rng = RngState(self._generators + self._attributes.generators)
        leaves: list[torch.Tensor] = list({id(p): p for _, _, p in self._parameters}.values())
        known = {id(p) for p in leaves}
        for t in self.inputs + self._attributes.tensors:  # a tensor attribute may require grad (not a Parameter)
            if t.is_leaf and t.requires_grad and id(t) not in known:
                leaves.append(t)
                known.add(id(t))
        # forward may freeze or unfreeze (`p.requires_grad_(False)`, `x.requires_grad_()`): each
        # parameter and leaf input gets its flag back, and its `.grad` (a non-leaf's flag is fixed)
        without_grad = [t for t in self.inputs if t.is_leaf and not t.requires_grad and id(t) not in known]
        self._requires_grad = [(t, t.requires_grad) for t in leaves + without_grad]
        self._grads = [(t, t.grad) for t in leaves + without_grad]
        for t, grad in self._grads:
            if grad is not None:
                t.grad = None
        self._buffers: list[tuple[torch.nn.Module, str, torch.Tensor]] = []
        clones: dict[int, torch.Tensor] = {}
        for module in modules:
            if not module._buffers:
                continue
            for name, buf in list(module._buffers.items()):
                if buf is None:
                    continue
                if id(buf) not in clones:
                    with torch.no_grad():
                        clones[id(buf)] = buf.clone()
                self._buffers.append((module, name, buf))
                module._buffers[name] = clones[id(buf)]
        # `param.data = other` in forward rebinds storage with no visible write: keep an alias
        # of each leaf's original binding (same storage, offset, sizes, strides) to compare.
        self._bindings = [(p, p.data) for p in leaves]
        self._protected = None  # built at the first write (many runs write nothing protected)
        return self

    def _protected_storages(self) -> dict[int, list[torch.Tensor]]:
        """Storage pointer -> the tensors on it whose bytes and versions are given back: the
        leaves (found by their original binding: forward may rebind `.data`, and `.data` has a
        version counter of its own), the inputs and the attribute tensors."""
        protected: dict[int, list[torch.Tensor]] = {}
        found = [(data, leaf) for leaf, data in self._bindings] + [(t, t) for t in self.inputs + self._attributes.tensors]
        for where, t in found:
            span = storage_span(where)
            if span is not None:
                protected.setdefault(span[0], []).append(t)
        return protected

    def before_write(self, t: torch.Tensor) -> None:
        """Called by the tracer before an op writes `t`: snapshot protected memory once."""
        span = storage_span(t)
        if span is None:
            return
        if self._protected is None:
            self._protected = self._protected_storages()
        owners = self._protected.get(span[0])
        if owners is not None and span[0] not in self._snapshots:
            # The whole storage: parameters or inputs may be views of one buffer.
            storage = t.untyped_storage()
            self._snapshots[span[0]] = (storage, storage.clone(), [(o, o._version) for o in owners])

    def __exit__(self, *exc: object) -> None:
        for module, name, param in self._parameters:  # `self.w = nn.Parameter(...)` in forward
            if module._parameters.get(name) is not param:
                module._parameters[name] = param
        for t, data in self._bindings:
            if t.dtype is not data.dtype or not t.is_set_to(data):
                t.data = data
        self._bindings = []
        versions: list[tuple[torch.Tensor, int]] = []
        for storage, snapshot, before in self._snapshots.values():
            storage.copy_(snapshot)  # bytes only: no tensor's version moves
            versions += before
        if versions:  # the bytes are as they were: so are the versions (a caller's graph that saved them still runs)
            set_versions([t for t, _ in versions], [v for _, v in versions])
        self._snapshots.clear()
        for module, name, buf in self._buffers:
            module._buffers[name] = buf
        self._attributes.restore()
        self._restore_grads_and_flags()
        self._rng.restore()

    def _restore_grads_and_flags(self) -> None:
        """`.grad`, `requires_grad` and the train/eval flags as they were, each set only where it changed."""
        for t, grad in self._grads:
            if t.grad is not grad:
                t.grad = grad
        for t, flag in self._requires_grad:
            if t.requires_grad is not flag:
                t.requires_grad_(flag)
        for m, flag in self._training:
            if m.training is not flag:  # Module.__setattr__ is slow: only where it changed
                m.training = flag


def refuse_lazy(model: torch.nn.Module, modules: list[torch.nn.Module]) -> None:
    """Raise if a module in `modules` (model's) holds a lazy parameter not yet initialized."""
    # The mixin, not UninitializedParameter: Parameter's metaclass makes isinstance against
    # it slow, and this runs on every parameter of every audit.
    from torch.nn.parameter import UninitializedTensorMixin  # type: ignore[attr-defined]

    for module in modules:  # names only on the rare failure: named_modules() is slow
        for name, p in module._parameters.items():
            if isinstance(p, UninitializedTensorMixin):
                module_name = next(n for n, m in model.named_modules() if m is module)
                full = f"{module_name}.{name}" if module_name else name
                raise UsageError(
                    f"parameter {full!r} is an uninitialized lazy parameter; call the model once on a real "
                    "input before auditing it (audit would otherwise leave it initialized)"
                )
