"""In-place calls whose out-of-place form would leave other references holding the original value.

`nn.ReLU(inplace=True)`, `F.relu(x, inplace=True)` and `x += y` overwrite the
tensor object `x`. In the out-of-place program, the result is a new tensor and
every other reference to `x` (a residual branch, a list, `torch.cat([h,
act(h)])`) still sees the original values. To see such reads in one run, the
call's result is handed back as a fresh alias of `x`: code that continues with
the result is unaffected, and a later op that still reads the old object `x`
is exactly a read that the out-of-place program would have served with the
original values. A snapshot taken before the call measures the difference.

Parameters and registered buffers are never aliased (their identity matters),
nor tensors that require grad while grad mode is off (an alias could not keep
their autograd meaning). The alias of a tensor that requires grad is a view of
it, so autograd keeps the in-place history exactly: gradients are those of the
program as written. A later in-place call on that alias (`out += identity`
then `relu(out, inplace=True)`) runs on the tensor it views, as plain PyTorch
would, rather than on the view, which would cost a CopySlices node (full-size
copies at backward). Nothing is aliased while `torch.jit.trace` records (the trace would
hold it). The tool's own reads run with torch-function handling off: a program's mode below sees its calls only.
"""

from __future__ import annotations

import dis
import functools
import sys
import weakref
from types import FrameType, MappingProxyType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ... import _compat
from ...events import OriginalValueRead
from ..fast.suspect_calls import SuspectCalls
from ..ops import op_name
from ..owner import Busy, TraceOwner
from ..places.modules import ModulePaths
from ..places.stacks import capture_frames, capture_stack, is_user_file, make_site
from ..raised.blame import call_through, passed_through
from ..saves.contents import HAND_OUTS
from .stale_aliases import Overwritten, StaleAliases, before_values_difference, called_by_the_tool, reads, tensors_in
from .value_change import finite, largest_change, positional_change

_BINARY_OP = dis.opmap.get("BINARY_OP")  # Python 3.11+: one opcode, the operator in its argument
_INPLACE_ARGS = frozenset(i for i, (name, _) in enumerate(getattr(dis, "_nb_ops", ())) if name.startswith("NB_INPLACE"))
_INPLACE_OPCODES = frozenset(op for name, op in dis.opmap.items() if name.startswith("INPLACE_"))  # Python 3.10
_NAME_STORES = frozenset({"STORE_FAST", "STORE_NAME", "STORE_GLOBAL", "STORE_DEREF"})
# code -> {offset of a `name op= value` operator: whether `name` is an argument of a helper function}
_augmented_into_names: dict[Any, dict[int, bool]] = {}
#: the code of the tool's wrappers between the program's `x += y` and the call the mode sees
ENTRY_CODES: set[Any] = set()


def _is_augmented_operator(instruction: dis.Instruction) -> bool:
    if _BINARY_OP is not None:
        return instruction.opcode == _BINARY_OP and instruction.arg in _INPLACE_ARGS
    return instruction.opcode in _INPLACE_OPCODES


def _augmented_target(frame: FrameType | None) -> bool | None:
    """None unless `frame` is executing `x += y` (any augmented operator) into a plain name right
    now; then whether `x` is an argument of a helper function (not a module's `forward`), whose
    caller may rely on the mutation.

    Not `x[i] += y` or `self.n += 1`: Python writes a subscript or attribute target back with
    `__setitem__` / `__setattr__` after the operator; handing that write-back a different object
    than the operator returned changes what PyTorch does (an in-place copy of a tensor onto an
    alias of itself raises a memory-overlap error)."""
    if frame is None:
        return None
    code = frame.f_code
    offsets = _augmented_into_names.get(code)
    if offsets is None:
        instructions = list(dis.get_instructions(code))
        n_args = code.co_argcount + code.co_kwonlyargcount
        helper = code.co_name not in ("forward", "<module>")
        offsets = _augmented_into_names[code] = {
            here.offset: helper and after.opname == "STORE_FAST" and isinstance(after.arg, int) and after.arg < n_args
            for here, after in zip(instructions, instructions[1:])
            if _is_augmented_operator(here) and after.opname in _NAME_STORES
        }
    return offsets.get(frame.f_lasti)


#: func -> what a call of it may need beyond passing it on (`_AUGMENTABLE`, `_HANDS_OUT`): one lookup per call
_plans: dict[Any, int] = {}
_AUGMENTABLE = 1  # its name says in place (`add_`, `__iadd__`): `x += y` and `x.add_(y)` may be one
_HANDS_OUT = 2  # a method that hands the tensor's memory out (`.numpy()`, `.data_ptr()`)


def _plan_of(func: Any) -> int:
    name = getattr(func, "__name__", "")
    plan = _AUGMENTABLE if name.endswith("_") and not name.startswith("_") or name.startswith("__i") else 0
    try:
        if func in HAND_OUTS:
            plan |= _HANDS_OUT
        if len(_plans) < 4096:
            _plans[func] = plan
    except TypeError:  # a function that cannot be a key
        pass
    return plan


_PLAIN = (torch.Tensor, torch.nn.Parameter)
_DisableTorchFunction, _tracing_state = torch._C.DisableTorchFunction, _compat.jit_tracing_state
_NO_KWARGS: Any = MappingProxyType({})  # shared, read-only: no dict made per call


class InplaceCalls(TorchFunctionMode):
    """Watches in-place calls (flags and augmented assignment) and later reads of what they overwrote."""

    def __init__(self, owner: TraceOwner, modules: ModulePaths) -> None:
        super().__init__()
        self.owner = owner
        self.modules = modules
        self.overwritten: dict[int, Overwritten] = {}
        self._stale = StaleAliases()  # views and detaches of overwritten tensors made before the write
        # Snapshots usually die right after the call's module returns: reusing their
        # memory avoids a fresh (page-faulting) allocation for every in-place call.
        self._pool: dict[tuple[Any, ...], list[torch.Tensor]] = {}
        # The aliases handed back for tensors that require grad (views of what was overwritten).
        # id -> weakref (a WeakSet would compare tensors with `==`); pruned as it grows.
        self._aliases: dict[int, weakref.ref[torch.Tensor]] = {}
        #: called with (tensor, how) after `.numpy()`, `__dlpack__()`, `.data_ptr()` hand memory out
        self.on_hand_out: Any = None
        #: > 0 while a call with an `inplace=True` argument runs: its writes were asked for
        self.flag_calls = 0
        self._suspects: SuspectCalls | None = None
        self._awaiting: dict[int, Any] = {}
        self.suspects = None
        #: whether a returning call settles the writes made so far (`TraceOwner.user_call_returned`:
        #: fail-fast only; the tracer turns it off otherwise, which spares every call a method call)
        self.settles_writes = True
        #: set while the tool's own torch calls run (the fast tracer's write kernels see them otherwise)
        self.own_work = Busy()
        #: whether the values overwritten are measured and their reads awaited (IPD105; the fast
        #: tracer turns it off when no rule reads `OriginalValueRead`: the aliases stay, as in deep mode)
        self.measures = True
        self.handling = 0  # calls of this mode's handler running now (on the thread of its session)

    @property
    def suspects(self) -> SuspectCalls | None:
        """The fast tracer's: the calls handed an object a read is awaited of run under a dispatch mode."""
        return self._suspects

    @suspects.setter
    def suspects(self, suspects: SuspectCalls | None) -> None:
        self._suspects = suspects
        self._awaiting = suspects.awaiting if suspects is not None else {}  # a dict its owner never replaces

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # The common call (no `inplace=True`, a name not in place, nothing awaited) costs two lookups:
        # the mode sees every torch-level call of the program.
        try:
            plan = _plans[func]
        except (KeyError, TypeError):
            plan = _plan_of(func)
        flag = kwargs and kwargs.get("inplace") is True
        observed = plan or flag or self.overwritten or self._awaiting or self.settles_writes
        self.handling += 1  # torch has set this mode aside meanwhile (`InplaceEntries._mend`)
        try:
            if observed:
                return self._observed(func, args, kwargs or _NO_KWARGS, plan)
            try:
                return func(*args, **kwargs) if kwargs else func(*args)
            except BaseException as exc:
                passed_through(exc)  # `call_through` inlined: one frame less on every call
                self._raised(exc, func, args)
                raise
        finally:
            self.handling -= 1

    def _observed(self, func: Any, args: Any, kwargs: Any, plan: int) -> Any:  # noqa: C901 - once per observed call: a helper is a Python call per op on the measured overhead
        owner = self.owner
        kind = None
        if args and type(args[0]) in _PLAIN and not owner.busy:
            if kwargs and kwargs.get("inplace") is True:
                kind = "flag"
            elif plan & _AUGMENTABLE:
                caller = sys._getframe(2)  # the program's frame, past `__torch_function__`
                if caller.f_code in ENTRY_CODES:  # and past the augmented method's wrapper (`inplace_entry.py`)
                    caller = caller.f_back  # type: ignore[assignment]
                # Only the user's own `x += y`: a library's (an optimizer's `step += 1`)
                # keeps its state objects on purpose.
                # Nor `x += y` on an argument of a helper (`def center(batch, mean): batch -= mean`):
                # its caller relies on the mutation, which is the function's whole point.
                if is_user_file(caller.f_code.co_filename) and _augmented_target(caller) is False:
                    kind = "augmented"
        if kind == "flag":
            self.flag_calls += 1
        suspects = self._suspects
        watched = (
            suspects is not None
            and (self.overwritten or self._awaiting)
            and not owner.busy
            and suspects.handed(args, kwargs)
        )
        if watched:
            suspects.enter()  # type: ignore[union-attr]
        stale = self._stale_read(args, kwargs) if self.overwritten and self.measures and not owner.busy else None
        try:
            out = func(*args, **kwargs) if kind is None else self._inplace_call(func, args, kwargs, kind)
        except BaseException as exc:
            if kind is None:
                passed_through(exc)
            self._raised(exc, func, args, kind == "flag")
            raise
        finally:
            if kind == "flag":
                self.flag_calls -= 1
            if watched:
                suspects.leave()  # type: ignore[union-attr]
        if stale is not None:
            self._stale_returned(func, args, kwargs, out, stale)
        if plan & _HANDS_OUT and self.on_hand_out is not None and args and not owner.busy:
            self.on_hand_out(args[0], *HAND_OUTS[func])
        if self.settles_writes:
            owner.user_call_returned()
        return out

    def _stale_read(self, args: Any, kwargs: Any) -> list[tuple[Overwritten, torch.Tensor, float]]:
        """Stale aliases among a call's arguments (`stale_aliases.py`), with what they held before the write."""
        if not self._stale.followed(self.overwritten):
            return []
        with _DisableTorchFunction(), _compat.DisableTorchDispatch(), self.own_work:
            found = self._stale.found(self.overwritten, args, kwargs)
            if not found or called_by_the_tool(1, ENTRY_CODES) or _compat.current_autograd_node() is not None:
                return []  # the tool's own reads of its records; a custom Function's backward (no forward read)
            return [(e, t, before_values_difference(e, t)) for e, t in found]

    def scripted_returned(self, out: Any) -> None:
        """What scripted code returned (its ops make no torch-level call): tensors made now."""
        self._stale_returned(None, (), None, out, [])

    def _stale_returned(
        self, func: Any, args: Any, kwargs: Any, out: Any, stale: list[tuple[Overwritten, torch.Tensor, float]]
    ) -> None:
        if not stale and not self._stale.followed(self.overwritten):
            return
        with _DisableTorchFunction(), _compat.DisableTorchDispatch(), self.own_work:
            pairs = [(e, t) for e, t, _ in stale]
            self._stale.made(func, args, out, self.overwritten, pairs)
            if not stale or not reads(func, out, pairs, args, kwargs):
                return
        frames, api = capture_frames()
        name = getattr(func, "__name__", "call").strip("_")
        for entry, _, difference in stale:
            if self.overwritten.pop(id(entry.ref()), None) is entry:  # the first read of each write, reported
                read = make_site(name, frames, api, self.modules.current, "forward")
                self.owner.emit(OriginalValueRead(entry.write(), read, entry.kind, difference, through_alias=True))

    def _raised(self, exc: BaseException, func: Any, args: Any, flag: bool = False) -> None:
        if isinstance(exc, RuntimeError) and args and isinstance(args[0], torch.Tensor) and not self.owner.busy:
            self.owner.call_raised(exc, func, args[0], flag)

    def _inplace_call(self, func: Any, args: Any, kwargs: Any, kind: str) -> Any:  # noqa: C901 - once per in-place call: a helper is a Python call per op on the measured overhead
        # The tool's own reads and tensors here run with torch-function handling off: a mode the
        # program entered below this one sees the program's calls only (`target` is a plain tensor).
        target = args[0]
        with _DisableTorchFunction():
            skip = (
                # `torch.jit.trace` would record the alias handed back, and its check would fail
                _tracing_state() is not None
                or (target.requires_grad and not torch.is_grad_enabled())
                or isinstance(target, torch.nn.Parameter)
                or id(target) in self.modules.buffer_ids()
                or target.is_inference()
                or target.numel() == 0
                # inside torch.func's vmap/grad: a batched or grad-tracking wrapper, whose values
                # cannot be read (`.item()`, `min()`) to measure the change
                or _compat.is_functorch_wrapped(target)
            )
            real = target if skip else self._viewed_by_alias(target)
            version = 0 if skip else real._version  # unchanged after the call: it wrote nothing (p=0 dropout)
        if skip:
            return call_through(func, args, kwargs)
        snapshot: torch.Tensor | None = None
        change: float | None = None
        if self.measures:
            with _DisableTorchFunction(), _compat.DisableTorchDispatch(), torch.no_grad(), self.own_work:
                change = largest_change(func, args, kwargs)
                if change is None:
                    spare = self._pool.get((target.shape, target.dtype, target.device))
                    if spare:
                        snapshot = spare.pop()
                        snapshot.copy_(target)
                    else:
                        snapshot = target.clone(memory_format=torch.contiguous_format)
        stack = capture_stack() if self.measures else None
        if real is target:
            out = call_through(func, args, kwargs)
        else:
            # `target` is the alias an earlier in-place call handed back: run this one on the tensor it
            # views, the very object plain PyTorch would have here. In place on the view itself, autograd
            # would rebase the base's history through CopySlices and AsStrided nodes (7 % of a ResNet-50 step).
            hidden = self.overwritten.pop(id(real), None)  # written here, not read
            try:
                out = call_through(func, (real, *args[1:]), kwargs)
            finally:
                if hidden is not None:
                    self.overwritten[id(real)] = hidden
        if out is not real:
            return out
        with _DisableTorchFunction(), _compat.DisableTorchDispatch(), self.own_work:
            if real._version == version:  # wrote nothing, returned its input: what it was handed (an alias)
                return target
            if real.requires_grad:
                alias = real.view_as(real)
                if len(self._aliases) > 4096:
                    self._aliases = {k: ref for k, ref in self._aliases.items() if ref() is not None}
                self._aliases[id(alias)] = weakref.ref(alias)
            else:
                alias = real.detach()
            if not self.measures:
                return alias
            op = getattr(func, "__name__", "in-place call")  # the form (flag or `+=`) is the site's own field
            key = id(target)
            module = self.modules.current
            origin = None
            if module is not None and module[3]:  # resolved later, only if a read is reported
                running = self.modules.current_module()
                if running is not None:
                    origin = functools.partial(self.modules.origin_for, running, module[0])
            entry = self.overwritten[key] = Overwritten(  # it reads the target's shape and dtype
                weakref.ref(target, self._forget(key)), snapshot, change, op, stack, module, target, kind, origin
            )
            self._stale.written(entry, target, alias)
        return alias

    def _viewed_by_alias(self, t: torch.Tensor) -> torch.Tensor:
        """The tensor `t` views when `t` is one of our aliases covering all of it; else `t`."""
        ref = self._aliases.get(id(t))
        if ref is None or ref() is not t:
            return t
        base = t._base
        if (
            base is None
            or base.dtype != t.dtype
            or base.shape != t.shape
            or base.stride() != t.stride()
            or base.storage_offset() != t.storage_offset()
        ):
            return t
        return base

    def _forget(self, key: int) -> Any:
        def forget(_ref: Any) -> None:
            entry = self.overwritten.pop(key, None)
            if entry is not None and entry.snapshot is not None:
                self._recycle(entry.snapshot)

        return forget

    def _recycle(self, snapshot: torch.Tensor) -> None:
        spares = self._pool.setdefault((snapshot.shape, snapshot.dtype, snapshot.device), [])
        if len(spares) < 4:
            spares.append(snapshot)

    def check_reads(self, func: Any, args: Any, kwargs: Any) -> None:
        """Called for each forward op while overwritten objects exist: report reads of them."""
        for t in tensors_in(args, kwargs):
            self._check(func, t)

    def _check(self, func: Any, t: torch.Tensor) -> None:
        entry = self.overwritten.get(id(t))
        if entry is None or entry.ref() is not t:
            return
        del self.overwritten[id(t)]  # report the first read; the snapshot is freed with the entry
        name = op_name(func)
        if name in ("aten.copy_", "aten.fill_", "aten.zero_", "aten.set_", "aten.resize_"):
            return  # overwrites without reading
        if entry.snapshot is None:  # measured before the write, without a copy
            difference = float(entry.change or 0.0)
        else:
            with _compat.DisableTorchDispatch(), torch.no_grad():
                if t.is_floating_point() or t.is_complex():
                    difference = float((t - entry.snapshot).abs().max())
                    if not finite(difference) and t.is_floating_point():  # NaN/inf: compared by position
                        after = t.double()
                        difference = positional_change(entry.snapshot.double(), lambda before: after)
                else:
                    difference = float(torch.ne(t, entry.snapshot).sum())
        frames, api = capture_frames()
        read = make_site(name, frames, api, self.modules.current, "forward")
        self.owner.emit(OriginalValueRead(entry.write(), read, entry.kind, difference))

    def clear(self) -> None:
        self.flag_calls = 0
        self.overwritten.clear()
        self._pool.clear()
        self._aliases.clear()
        self._stale.clear()
