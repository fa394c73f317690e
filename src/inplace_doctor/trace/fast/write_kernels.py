"""Writes seen without a dispatch mode: one Python kernel per mutating aten overload.

Each kernel is registered with `torch.library` at the `ADInplaceOrView` key
(the key whose generated kernels bump version counters), so only ops that
write enter Python; every other op stays in C++. A kernel redispatches below
its key, bumps the versions of the written tensors it returns (as PyTorch's
own kernel does, which it replaced; mutating ops without one, such as
`_foreach_*_` and the fused optimizer kernels, bump elsewhere and are only
recorded), then hands the op and the tensors it wrote to the recorder of the
current context.

Known limitations:
- Registration is process-wide: while any `WriteKernels` is entered, and for
  a second after the last one exits (`kernel_registration.py`), every write of
  every thread runs through a kernel (one Python call per write). Only the
  context that set a recorder (a `ContextVar`: threads started inside do not
  inherit it) records anything; a write with no recorder calls PyTorch's own
  `ADInplaceOrView` kernel at once (about 2.4 µs more than without the
  kernels; 8 µs where a Python number stands for a tensor).
- Ops that never reach `ADInplaceOrView` are not seen: writes to inference
  tensors (a normal tensor written under `torch.inference_mode` is seen);
  `CompositeImplicitAutograd`
  ops are seen through the ops they decompose into. Writes that bypass the
  dispatcher (through `.numpy()`, DLPack) are not seen by any kernel.
- View ops keep PyTorch's kernels: only overloads whose schema writes an
  argument are registered, and in-place view ops that only change metadata
  (`transpose_`, `squeeze_`, `as_strided_`, ...) are left alone.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

import torch

from ..ops import WriteSpec, op_name, write_spec, written_tensors
from ..process.kernel_registration import OVERRIDE_WARNING, registration
from ..raised.blame import passed_through

#: called with (op, tensors it writes) around each write, in the context that set it
Recorder = Callable[[Any, list[torch.Tensor]], None]
#: called with (op, the exception) when PyTorch raised at a write
Failed = Callable[[Any, BaseException], None]
#: called with (op, tensors it writes, the op's positional arguments) before the op runs
Before = Callable[[Any, list[torch.Tensor], Any], None]
#: (called before the op runs or None, called after its version bump, called when it raised or None)
_Hooks = tuple[Before | None, Recorder, Failed | None]
_RECORDER: contextvars.ContextVar[_Hooks | None] = contextvars.ContextVar("inplace_doctor_writes", default=None)

# In-place ops that only change a view's metadata: their ADInplaceOrView kernels set up view
# bookkeeping a redispatch would skip, and they write no bytes.
_METADATA_VIEWS = frozenset(
    {
        "as_strided_", "detach_", "squeeze_", "unsqueeze_", "t_", "transpose_", "swapdims_", "swapaxes_",
        "_coalesced_", "requires_grad_",
    }
)
_NUMBERS = (int, float, complex)


def mutating_overloads() -> list[tuple[Any, WriteSpec, bool]]:
    """(op, write spec, has its own ADInplaceOrView kernel) for every aten overload that writes an argument."""
    found = []
    for qualified in torch._C._dispatch_get_all_op_names():
        if not qualified.startswith("aten::"):
            continue
        base, _, overload = qualified[6:].partition(".")
        if base in _METADATA_VIEWS:
            continue
        packet = getattr(torch.ops.aten, base, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if op is None:
            continue
        spec = write_spec(op)
        if spec:
            found.append((op, spec, torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "ADInplaceOrView")))
    return found


def _number_slots(op: Any) -> tuple[tuple[str, int], ...]:
    """Arguments typed `Tensor` that a Python number may arrive in: a wrapped number (`x.mul_(2)`)
    reaches a Python kernel as the number, which a boxed redispatch refuses."""
    return tuple(
        (arg.name, i) for i, arg in enumerate(op._schema.arguments) if isinstance(arg.type, torch._C.TensorType)
    )


def _kernel(op: Any, spec: WriteSpec, own: Any) -> Callable[..., Any]:  # noqa: C901 - builds the per-op kernel closure; its branches pick what the hot closure does
    """The kernel of `op`: `own` is PyTorch's own kernel at the key (a `_SafeKernelFunction`), None
    where it had none (a fallthrough), False where it had one that cannot be called from here."""
    after = torch._C._after_ADInplaceOrView_keyset
    redispatch = op.redispatch
    increment_version = torch.autograd.graph.increment_version
    get = _RECORDER.get
    slots: list[tuple[tuple[str, int], ...]] = []  # read from the schema at the first call, not at registration
    below = torch._C._AutoDispatchBelowADInplaceOrView
    call_own = own.call_boxed if own else None

    def number_in(args: Any, kwargs: Any) -> bool:
        """A Python number in a `Tensor` slot: a wrapped number (`x.mul_(2)`) reaches a Python kernel
        as the number, which a boxed call refuses; the argument parser wraps it as PyTorch did."""
        if not slots:
            slots.append(_number_slots(op))
        return any(isinstance(args[i] if i < len(args) else kwargs.get(name), _NUMBERS) for name, i in slots[0])

    def run(keyset: Any, args: Any, kwargs: Any, hooks: _Hooks | None) -> Any:
        try:
            if number_in(args, kwargs):
                with below():  # a wrapped number keeps its type-promotion rules
                    return op(*args, **kwargs)
            return redispatch(keyset & after, *args, **kwargs)
        except BaseException as exc:
            passed_through(exc)  # PyTorch's error at the program's op, not the tool's
            if hooks is not None and hooks[2] is not None:
                hooks[2](op, exc)
            raise

    def replacing(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        """In place of PyTorch's own kernel, as it does: ops called inside run below autograd and
        this key (neither bumped twice nor recorded as writes of their own: index_put_'s)."""
        hooks = get()
        if hooks is None and call_own is not None and not number_in(args, kwargs):
            try:  # no session in this context (or inside a fallthrough op's kernel): PyTorch's kernel, in C++
                return call_own(keyset, *args, **kwargs)
            except BaseException as exc:
                passed_through(exc)  # the error of the op inside, not an outer kernel's
                raise
        written = written_tensors(spec, args, kwargs)
        if hooks is not None and hooks[0] is not None:
            hooks[0](op, written, args)
        with below():
            out = run(keyset, args, kwargs, hooks)
        # As PyTorch's kernel does: the written tensors the op returns, not the others it writes
        # (`rrelu_with_noise_`'s noise, batch norm's running statistics keep their versions).
        returned = out if isinstance(out, (tuple, list)) else (out,)
        increment_version([t for t in written if any(t is r for r in returned)])
        if hooks is not None:
            hooks[1](op, written)
        return out

    def passing(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        """Where PyTorch had no kernel at this key (a fallthrough): the ops called inside bump the
        versions (`_foreach_add_`'s per-tensor `add_`), so they run as without us, unrecorded."""
        hooks = get()
        if hooks is None:
            return run(keyset, args, kwargs, None)
        written = written_tensors(spec, args, kwargs)
        if hooks[0] is not None:
            hooks[0](op, written, args)
        token = _RECORDER.set(None)
        try:
            out = run(keyset, args, kwargs, hooks)
        finally:
            _RECORDER.reset(token)
        hooks[1](op, written)
        return out

    kernel = passing if own is None else replacing
    kernel.__name__ = f"inplace_doctor_{op_name(op).replace('.', '_')}"
    return kernel


def _build() -> list[tuple[Any, Callable[..., Any]]]:
    """(op, its kernel) for every mutating overload, with PyTorch's own kernels read before ours hide them."""
    computed = getattr(torch._C, "_dispatch_get_computed_kernel_for_dispatch_key", None)
    key = torch._C.DispatchKey.ADInplaceOrView
    built = []
    for op, spec, bumps in mutating_overloads():
        own = (computed(op._name, key) if computed is not None else False) if bumps else None
        built.append((op, _kernel(op, spec, own)))
    return built


_REGISTRATION = registration(_build)


def _nested(inner: _Hooks, outer: _Hooks) -> _Hooks:
    """The hooks of a context entered inside another's: each write goes to both, in the order two
    stacked dispatch modes see an op (the inner one first before it, last after it). While one
    context's hook runs, the writes its own work makes go to that context alone (which knows them
    for its own): the other is not told of a write the program did not make."""
    inner_before, inner_after, inner_failed = inner
    outer_before, outer_after, outer_failed = outer

    def alone(hooks: _Hooks, hook: Callable[..., None], *args: Any) -> None:
        token = _RECORDER.set(hooks)
        try:
            hook(*args)
        finally:
            _RECORDER.reset(token)

    def before(op: Any, written: list[torch.Tensor], args: Any) -> None:
        if inner_before is not None:
            alone(inner, inner_before, op, written, args)
        if outer_before is not None:
            alone(outer, outer_before, op, written, args)

    def after(op: Any, written: list[torch.Tensor]) -> None:
        alone(outer, outer_after, op, written)
        alone(inner, inner_after, op, written)

    def failed(op: Any, exc: BaseException) -> None:
        if inner_failed is not None:
            alone(inner, inner_failed, op, exc)
        if outer_failed is not None:
            alone(outer, outer_failed, op, exc)

    return before, after, failed


class WriteKernels:
    """Context manager: the kernels registered, and `recorder` called for each write of this context.

    Args:
        recorder: called with (op, written tensors) after each write made in
            the context that entered (not in other threads), after the
            version bump.
        before: called likewise before the op runs, with the op's positional arguments too.
        failed: called with (op, exception) when PyTorch raised at a write of this context.

    Example:
        >>> seen = []
        >>> with WriteKernels(lambda op, written: seen.append(op)):
        ...     torch.zeros(2).add_(1)
    """

    def __init__(self, recorder: Recorder, before: Before | None = None, failed: Failed | None = None) -> None:
        self.hooks: _Hooks = (before, recorder, failed)
        self._token: contextvars.Token[_Hooks | None] | None = None

    def __enter__(self) -> WriteKernels:
        _REGISTRATION.acquire()
        outer = _RECORDER.get()  # a session entered inside another: both see its writes, as nested modes do
        self._token = _RECORDER.set(self.hooks if outer is None else _nested(self.hooks, outer))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _RECORDER.reset(self._token)
            self._token = None
        _REGISTRATION.release()


def registered() -> int:
    """How many kernels are registered now (0 when no `WriteKernels` is entered and the linger ended)."""
    return _REGISTRATION.count


def registrations() -> int:
    """How many times the kernels were registered in this process."""
    return _REGISTRATION.registrations


def end_linger() -> None:
    """Remove the kernels now unless a `WriteKernels` is entered (they linger a second after the last)."""
    _REGISTRATION.end_linger()


__all__ = ["WriteKernels", "end_linger", "mutating_overloads", "registered", "registrations", "OVERRIDE_WARNING"]
