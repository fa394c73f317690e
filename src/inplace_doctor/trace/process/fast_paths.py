"""PyTorch's fused inference paths taken under a session exactly as without one.

`nn.MultiheadAttention`, `nn.TransformerEncoderLayer` and `nn.TransformerEncoder` choose in their
`forward` between a fused kernel (`_native_multi_head_attention`, `_transformer_encoder_layer_fwd`,
a nested tensor for a padded batch) and the composite path; any `TorchFunctionMode` on the
thread's stack makes `torch.overrides.has_torch_function` True for their tensors and rules the
fused one out. The tracer's `InplaceCalls` mode (always on in deep mode and under fail-fast, on
after an in-place call in the fast tracer) would so change what the program computes: other
rounding in the last bit, and for a padded batch through `TransformerEncoder` other values at the
padded positions (zeros on the nested path).

So while such a module's `forward` runs where its fused path can be taken (eval mode, and grad
off or nothing of the call requiring grad), the thread's `InplaceCalls` modes are lifted off the
stack and put back where they were when it returns or raises. They count the time as handled
(`InplaceCalls.handling`), as when torch sets a mode aside while its handler runs, so the fast
tracer's `InplaceEntries` neither pushes nor pops them meanwhile. The program's own modes stay:
with one of them on, torch takes the composite path, as it does without the tool.

Reads there are still seen: the deep tracer's dispatch mode sees every op, and where the fast
tracer awaits the read of an object the call is handed, the call runs under its dispatch mode for
reads, as the function mode would have run its first call inside (`suspect_calls.py`).

Known limitations: inside those forwards the modes see no call: torch's code there makes no
in-place call, but an `inplace=True` module or `x += y` of a program's layer run by
`TransformerEncoder` in eval mode is not seen (IPD105, IPD106), nor, by the fast tracer, a read
of an awaited object the module holds rather than is handed. An instance attribute `forward` set
by the program runs without the entry code.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from ..raised.blame import passed_through
from ..reads.inplace_calls import InplaceCalls
from .code_swap import SwappedCodes

_stack_length = torch._C._len_torch_function_stack
_stack_at = torch._C._get_function_stack_at
_push = torch._C._push_on_torch_function_stack
_pop = torch._C._pop_torch_function_stack

#: the modules whose `forward` picks a fused path by `has_torch_function` (torch 2.14: `activation.py`,
#: `transformer.py`)
FUSED_PATH_MODULES: tuple[type[nn.Module], ...] = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder)


def _fused_path_possible(module: nn.Module, args: tuple[Any, ...]) -> bool:
    """What each of them asks first: eval mode, and no autograd recording of the call."""
    if module.training:
        return False
    if not torch.is_grad_enabled():
        return True
    tensors = [t for t in args if isinstance(t, torch.Tensor)]
    return not any(t.requires_grad for t in tensors) and not any(p.requires_grad for p in module.parameters())


def _lift() -> tuple[list[Any], list[InplaceCalls]]:
    """This thread's `InplaceCalls` modes off the stack: (the stack before, the modes lifted)."""
    before = [_stack_at(i) for i in range(_stack_length())]
    ours = [mode for mode in before if isinstance(mode, InplaceCalls)]
    if not ours:
        return before, ours
    for _ in before:
        _pop()
    for mode in before:
        if not isinstance(mode, InplaceCalls):
            _push(mode)
    for mode in ours:
        mode.handling += 1
    return before, ours


def _put_back(before: list[Any], ours: list[InplaceCalls]) -> None:
    """The lifted modes back at their places among the modes on the stack now."""
    for mode in ours:
        mode.handling -= 1
    now = [_stack_at(i) for i in range(_stack_length())]
    for _ in now:
        _pop()
    for at, mode in enumerate(before):
        if isinstance(mode, InplaceCalls):
            now.insert(min(at, len(now)), mode)
    for mode in now:
        _push(mode)


_ENTRY = "_inplace_doctor_fused_entry"  # the name the entry codes call, in each class's module


class FusedPaths(SwappedCodes[object]):
    """While any session is in, each class's `forward` runs an entry code of the same signature
    (`code_swap.py`, as `inplace_entry._FlagFunctions` for `torch.nn.functional`): `return
    _inplace_doctor_fused_entry(k)(<its arguments>)`, which runs torch's code (a copy of the
    function) with the thread's modes lifted where the fused path can be taken. A subclass's
    `super().forward(...)` is seen too. A session enters it as a context (`fused_paths()`)."""

    def __init__(self) -> None:
        super().__init__(_ENTRY, f"__import__({__name__!r}, fromlist=['_FUSED'])._FUSED.body")

    def _prepare(self) -> None:
        for cls in FUSED_PATH_MODULES:
            value = cls.__dict__.get("forward")
            if not inspect.isfunction(value) or value.__closure__ is not None:
                continue
            parameters = inspect.signature(value).parameters
            if any(p.kind is not p.POSITIONAL_OR_KEYWORD for p in parameters.values()):
                continue
            self.add(value, list(parameters))

    def entry(self, key: int, *args: Any) -> Any:
        """What function `key` runs: torch's code, with the modes lifted where its fused path may run."""
        return functools.partial(_run_lifted, self.bodies[key]) if _stack_length() else self.bodies[key]


def _run_lifted(body: Any, module: nn.Module, *args: Any) -> Any:
    if not _fused_path_possible(module, args):
        return body(module, *args)
    before, ours = _lift()
    if not ours:
        return body(module, *args)
    # What the mode would do at the first call inside that is handed an object whose read is
    # awaited (the fast tracer's IPD105/IPD106): the call runs under the dispatch mode for reads.
    suspects = [
        mode.suspects for mode in ours
        if mode.suspects is not None and (mode.overwritten or mode.suspects.awaiting) and not mode.owner.busy
        and mode.suspects.handed(args, None)
    ]
    for watched in suspects:
        watched.enter()
    try:
        return body(module, *args)
    except BaseException as exc:
        passed_through(exc)
        raise
    finally:
        for watched in suspects:
            watched.leave()
        _put_back(before, ours)


_FUSED = FusedPaths()


@contextlib.contextmanager
def fused_paths() -> Iterator[None]:
    """Context manager: one session among those the entry codes are installed for."""
    token = object()
    _FUSED.acquire(token)
    try:
        yield
    finally:
        _FUSED.release(token)


__all__ = ["FUSED_PATH_MODULES", "FusedPaths", "fused_paths"]
