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
copies at backward).
"""

from __future__ import annotations

import dis
import functools
import sys
import weakref
from types import FrameType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .. import _compat
from ..causes import WriteForm
from ..events import OriginalValueRead, WriteInfo
from .blame import call_through
from .contents import HAND_OUTS
from .modules import ModuleContext, ModulePaths
from .ops import op_name
from .owner import TraceOwner
from .stacks import MAX_STACK, capture_frames, capture_stack, is_user_file, make_site, resolve_stack

_BINARY_OP = dis.opmap.get("BINARY_OP")  # Python 3.11+: one opcode, the operator in its argument
_INPLACE_ARGS = frozenset(i for i, (name, _) in enumerate(getattr(dis, "_nb_ops", ())) if name.startswith("NB_INPLACE"))
_INPLACE_OPCODES = frozenset(op for name, op in dis.opmap.items() if name.startswith("INPLACE_"))  # Python 3.10
_NAME_STORES = frozenset({"STORE_FAST", "STORE_NAME", "STORE_GLOBAL", "STORE_DEREF"})
# code -> {offset of a `name op= value` operator: whether `name` is an argument of a helper function}
_augmented_into_names: dict[Any, dict[int, bool]] = {}


def _is_augmented_operator(instruction: dis.Instruction) -> bool:
    if _BINARY_OP is not None:
        return instruction.opcode == _BINARY_OP and instruction.arg in _INPLACE_ARGS
    return instruction.opcode in _INPLACE_OPCODES


def _augmented_target(frame: FrameType | None) -> bool | None:
    """None unless `frame` is executing `x += y` (any augmented operator) into a plain name right
    now; then whether `x` is an argument of a helper function (not a module's `forward`), whose
    caller may rely on the mutation.

    Not `x[i] += y` or `self.n += 1`: Python writes a subscript or attribute
    target back with `__setitem__` / `__setattr__` after the operator; handing
    that write-back a different object than the operator returned changes what
    PyTorch does (an in-place copy of a tensor onto an alias of itself raises a
    memory-overlap error).
    """
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


def _augmentable(func: Any) -> bool:
    name = getattr(func, "__name__", "")
    return name.endswith("_") and not name.startswith("_") or name.startswith("__i")


_FORMS = {"flag": WriteForm.FLAG, "augmented": WriteForm.AUGMENTED}


class _Overwritten:
    """An object an in-place call overwrote, with its value from before (or the largest change made).

    Where the call ran is kept as a captured stack, resolved only if a read is reported.
    """

    __slots__ = ("ref", "snapshot", "change", "op", "stack", "module", "shape", "dtype", "kind", "find_origin")

    def __init__(
        self,
        ref: Any,
        snapshot: torch.Tensor | None,
        change: float | None,
        op: str,
        stack: Any,
        module: ModuleContext | None,
        target: torch.Tensor,
        kind: str,
        origin: Any = None,
    ) -> None:
        self.ref = ref
        self.snapshot = snapshot
        self.change = change
        self.op = op
        self.stack = stack
        self.module = module
        self.shape = tuple(target.shape)
        self.dtype = str(target.dtype).removeprefix("torch.")
        self.kind = kind
        self.find_origin = origin  # the module's construction line, looked up only when a read is reported

    def write(self) -> WriteInfo:
        frames, api, _ = resolve_stack(self.stack, MAX_STACK)
        origin = self.find_origin(tuple({f[0] for f in frames})) if self.find_origin is not None else None
        return WriteInfo(
            site=make_site(self.op, frames, api, self.module, "forward", origin, _FORMS[self.kind]),
            shape=self.shape,
            dtype=self.dtype,
            writes_bytes=True,
        )


def _arg(args: Any, kwargs: Any, index: int, name: str, default: Any) -> Any:
    return args[index] if len(args) > index else kwargs.get(name, default)


def largest_change(func: Any, args: Any, kwargs: Any) -> float | None:
    """The largest change an in-place call is about to make, from a read-only reduction
    (no copy of the tensor), for the common ops; None when it needs a snapshot.

    NaN/inf count by position: an element that holds the same non-finite value before and
    after is unchanged, and the change is the largest over elements finite before and after;
    inf when an element turns non-finite or stops being so (or inf changes sign). Only when the
    reduction itself comes out NaN or inf is the change worked out element by element."""
    x = args[0]
    if not x.is_floating_point() or x.numel() == 0:
        return None
    name = getattr(func, "__name__", "")
    if name == "relu":
        smallest = float(x.min())
        if not _finite(smallest):
            return _positional_change(x.double(), torch.relu)
        return max(0.0, -smallest)
    if name in ("hardtanh", "relu6"):
        low, high = (0.0, 6.0) if name == "relu6" else (_arg(args, kwargs, 1, "min_val", -1.0), _arg(args, kwargs, 2, "max_val", 1.0))
        smallest, biggest = (float(v) for v in torch.aminmax(x))
        if not _finite(smallest + biggest):  # NaN or inf in x
            return _positional_change(x.double(), lambda d: torch.nn.functional.hardtanh(d, float(low), float(high)))
        return max(0.0, float(low) - smallest, biggest - float(high))
    if name == "leaky_relu":
        slope = float(_arg(args, kwargs, 1, "negative_slope", 0.01))
        smallest = float(x.min())
        if not _finite(smallest):
            return _positional_change(x.double(), lambda d: torch.nn.functional.leaky_relu(d, slope))
        return abs(1.0 - slope) * max(0.0, -smallest)
    if name in ("add_", "sub_", "__iadd__", "__isub__"):
        other = _arg(args, kwargs, 1, "other", None)
        alpha = abs(float(kwargs.get("alpha", 1.0)))
        if isinstance(other, torch.Tensor) and other.is_floating_point():
            change = alpha * float(other.detach().abs().max()) if other.numel() else 0.0
        elif isinstance(other, (int, float)):
            change = alpha * abs(float(other))
        else:
            return None
        if not _finite(change):
            op = torch.sub if name in ("sub_", "__isub__") else torch.add
            operand = other.detach().double() if isinstance(other, torch.Tensor) else other
            return _positional_change(x.double(), lambda d: op(d, operand, alpha=kwargs.get("alpha", 1)))
        return change
    return None


def _finite(value: float) -> bool:
    return value - value == 0.0  # False for NaN and +-inf (inf - inf is NaN)


def _positional_change(before: torch.Tensor, op: Any) -> float:
    """The largest change `op` makes to `before` (in double, like the reductions' arithmetic),
    over the elements finite before and after; inf when an element is non-finite on one side only
    or holds different non-finite values (NaN vs inf, -inf vs inf). The same NaN/inf in the same
    place is no change."""
    after = op(before)
    finite_before, finite_after = torch.isfinite(before), torch.isfinite(after)
    both_nan = torch.isnan(before) & torch.isnan(after)
    same_inf = torch.isinf(before) & (before == after)
    unchanged_nonfinite = both_nan | same_inf
    if bool((~(finite_before & finite_after) & ~unchanged_nonfinite).any()):
        return float("inf")
    finite = finite_before & finite_after
    if not bool(finite.any()):
        return 0.0
    return float((after[finite] - before[finite]).abs().max())


class InplaceCalls(TorchFunctionMode):
    """Watches in-place calls (flags and augmented assignment) and later reads of what they overwrote."""

    def __init__(self, owner: TraceOwner, modules: ModulePaths) -> None:
        super().__init__()
        self.owner = owner
        self.modules = modules
        self.overwritten: dict[int, _Overwritten] = {}
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

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        owner = self.owner
        if kwargs is None:
            kwargs = {}
        kind = None
        if args and type(args[0]) in (torch.Tensor, torch.nn.Parameter) and not owner.busy:
            if kwargs.get("inplace") is True:
                kind = "flag"
            elif _augmentable(func):
                caller = sys._getframe(1)
                # Only the user's own `x += y`: a library's (an optimizer's `step += 1`)
                # keeps its state objects on purpose.
                # Nor `x += y` on an argument of a helper (`def center(batch, mean): batch -= mean`):
                # its caller relies on the mutation, which is the function's whole point.
                if is_user_file(caller.f_code.co_filename) and _augmented_target(caller) is False:
                    kind = "augmented"
        if kind == "flag":
            self.flag_calls += 1
        try:
            out = call_through(func, args, kwargs) if kind is None else self._inplace_call(func, args, kwargs, kind)
        except RuntimeError as exc:
            if args and isinstance(args[0], torch.Tensor) and not owner.busy:
                owner.call_raised(exc, func, args[0])
            raise
        finally:
            if kind == "flag":
                self.flag_calls -= 1
        if func in HAND_OUTS and self.on_hand_out is not None and args and not owner.busy:
            self.on_hand_out(args[0], *HAND_OUTS[func])
        owner.user_call_returned()
        return out

    def _inplace_call(self, func: Any, args: Any, kwargs: Any, kind: str) -> Any:
        target = args[0]
        keep_meaning = not (target.requires_grad and not torch.is_grad_enabled())
        if (
            not keep_meaning
            or isinstance(target, torch.nn.Parameter)
            or id(target) in self.modules.buffer_ids()
            or target.is_inference()
            or target.numel() == 0
            # inside torch.func's vmap/grad: a batched or grad-tracking wrapper, whose values
            # cannot be read (`.item()`, `min()`) to measure the change
            or _compat.is_functorch_wrapped(target)
        ):
            return call_through(func, args, kwargs)
        snapshot: torch.Tensor | None = None
        with _compat.DisableTorchDispatch(), torch.no_grad():
            change = largest_change(func, args, kwargs)
            if change is None:
                spare = self._pool.get((target.shape, target.dtype, target.device))
                if spare:
                    snapshot = spare.pop()
                    snapshot.copy_(target)
                else:
                    snapshot = target.clone(memory_format=torch.contiguous_format)
        stack = capture_stack()
        real = self._viewed_by_alias(target)
        if real is target:
            out = call_through(func, args, kwargs)
        else:
            # `target` is the alias an earlier in-place call handed back: run this one on the
            # tensor it views, the very object plain PyTorch would have here. In place on the
            # view itself, autograd would rebase the base's history through CopySlices and
            # AsStrided nodes, full-size copies at backward (7 % of a ResNet-50 step).
            hidden = self.overwritten.pop(id(real), None)  # written here, not read
            try:
                out = call_through(func, (real, *args[1:]), kwargs)
            finally:
                if hidden is not None:
                    self.overwritten[id(real)] = hidden
        if out is not real:
            return out
        with _compat.DisableTorchDispatch():
            if real.requires_grad:
                alias = real.view_as(real)
                if len(self._aliases) > 4096:
                    self._aliases = {k: ref for k, ref in self._aliases.items() if ref() is not None}
                self._aliases[id(alias)] = weakref.ref(alias)
            else:
                alias = real.detach()
        name = getattr(func, "__name__", "in-place call")
        op = name  # the form (flag or augmented assignment) is the site's own field
        key = id(target)
        module = self.modules.current
        origin = None
        if module is not None and module[3]:  # resolved later, only if a read is reported
            running = self.modules.current_module()
            if running is not None:
                origin = functools.partial(self.modules.origin_for, running, module[0])
        self.overwritten[key] = _Overwritten(
            weakref.ref(target, self._forget(key)), snapshot, change, op, stack, module, target, kind, origin
        )
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
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor):
                self._check(func, value)
            elif isinstance(value, (list, tuple)):
                for item in value:
                    if isinstance(item, torch.Tensor):
                        self._check(func, item)

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
                    if not _finite(difference) and t.is_floating_point():  # NaN/inf: compared by position
                        after = t.double()
                        difference = _positional_change(entry.snapshot.double(), lambda before: after)
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
