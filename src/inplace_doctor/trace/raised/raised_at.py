"""The in-place call an error was raised at, read from the raising frame's bytecode.

Autograd's own checks (a leaf that requires grad, a view returned with others
by `unbind`/`split`) raise before the dispatcher runs any kernel, so the fast
tracer, which sees only its write kernels, does not see the op. The deep
tracer's function mode sees the call; the fast one reads it from the
instruction the innermost frame was executing: an augmented assignment
(`p -= lr * g` is `sub_`), or a method call whose receiver is a plain name
(`first.mul_(2)`: the tensor `first` names, looked up in the frame).
"""

from __future__ import annotations

import dis
from types import CodeType, TracebackType

import torch

from ... import _compat

# Python's augmented assignments on a tensor, by the in-place op they call.
_AUGMENTED = {
    "+=": "add_", "-=": "sub_", "*=": "mul_", "/=": "div_", "//=": "floor_divide_", "%=": "remainder_",
    "**=": "pow_", "&=": "bitwise_and_", "|=": "bitwise_or_", "^=": "bitwise_xor_",
    "<<=": "bitwise_left_shift_", ">>=": "bitwise_right_shift_",
}
_INPLACE_OPNAMES = {  # before Python 3.11, one opcode per augmented operator
    "INPLACE_ADD": "add_", "INPLACE_SUBTRACT": "sub_", "INPLACE_MULTIPLY": "mul_", "INPLACE_TRUE_DIVIDE": "div_",
    "INPLACE_FLOOR_DIVIDE": "floor_divide_", "INPLACE_MODULO": "remainder_", "INPLACE_POWER": "pow_",
    "INPLACE_AND": "bitwise_and_", "INPLACE_OR": "bitwise_or_", "INPLACE_XOR": "bitwise_xor_",
}
_NAME_LOADS = frozenset({"LOAD_FAST", "LOAD_NAME", "LOAD_GLOBAL", "LOAD_DEREF"})
_METHOD_LOADS = frozenset({"LOAD_METHOD", "LOAD_ATTR"})


def _innermost(tb: TracebackType | None) -> TracebackType | None:
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last


def _instructions_to(code: CodeType, offset: int) -> list[dis.Instruction]:
    """The instructions of `code` up to the one at `offset` (the one that raised), that one last."""
    found = []
    for ins in dis.get_instructions(code):
        found.append(ins)
        if ins.offset >= offset:
            break
    return found


def augmented_op_raised_at(tb: TracebackType | None) -> str | None:
    """`aten.sub_` when the innermost frame raised at an augmented assignment (`p -= ...`), else None."""
    last = _innermost(tb)
    if last is None:
        return None
    ins = _instructions_to(last.tb_frame.f_code, last.tb_lasti)
    if not ins or ins[-1].offset != last.tb_lasti:
        return None
    op = _INPLACE_OPNAMES.get(ins[-1].opname)
    if op is None and ins[-1].opname == "BINARY_OP":
        op = _AUGMENTED.get(ins[-1].argrepr)
    return f"aten.{op}" if op is not None else None


def receiver_raised_at(tb: TracebackType | None) -> torch.Tensor | None:
    """The tensor an in-place method call was made on (`first` in `first.mul_(2)`), when the
    innermost frame raised at such a call on a plain name; None otherwise. The caller must not
    keep it (it reads its `grad_fn` at once)."""
    last = _innermost(tb)
    if last is None:
        return None
    frame = last.tb_frame
    ins = _instructions_to(frame.f_code, last.tb_lasti)
    if not ins or not ins[-1].opname.startswith("CALL"):
        return None
    for i in range(len(ins) - 2, 0, -1):
        method = ins[i]
        if method.opname.startswith("CALL"):
            return None  # a call inside the arguments: which receiver is not this simple
        if method.opname in _METHOD_LOADS and isinstance(method.argval, str):
            name = method.argval
            if not name.endswith("_") or name.startswith("__"):
                return None
            load = ins[i - 1]
            if load.opname not in _NAME_LOADS or not isinstance(load.argval, str):
                return None
            value = _compat.frame_locals(frame).get(load.argval, frame.f_globals.get(load.argval))
            return value if isinstance(value, torch.Tensor) else None
        if method.starts_line is not None and i < len(ins) - 1:
            return None  # the start of the line: no method load on it
    return None


__all__ = ["augmented_op_raised_at", "receiver_raised_at"]
