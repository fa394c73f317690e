"""Where each autograd node was created, so an error raised inside backward names a forward line.

Anomaly mode's one useful trick, without its cost: the node-creation hook the
tracer already runs stores, in the node's own `metadata` dict, a C capture of
the stack (no frames, no tensors kept), the running module and the op. The
entry lives and dies with the node. When backward fails, the failing node is
known from one of three places: the op that raised under the dispatch mode
(`current_autograd_node()` then), the custom `Function`'s `BackwardCFunction`
frame in the traceback (a Python `backward` that raised), or the last node the
dispatch mode saw run (autograd's engine checking what a node returned).
"""

from __future__ import annotations

import ast
import functools
import inspect
import os
import re
import sys
import textwrap
import weakref
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

import torch

from ... import _compat
from ..._parsing import parse
from ...sites import Site
from ..ops import op_name
from ..raised.blame import printable_text
from . import stacks as _stacks
from .modules import ModuleContext
from .stacks import SAVE_STACK, RawFrame, is_user_file, make_site, resolve_stack

_SavedTensor = _compat.SavedTensor

NODE_KEY = "inplace_doctor_created"  # the key in `node.metadata`
_FUNCTION_FILE = os.path.join("torch", "autograd", "function.py")


class MadeAt:
    """Where forward made something: a `capture_stack()` capture (or its resolution), the module
    running and the op's name. A saved tensor's record is one, and says where its node was made too."""

    __slots__ = ("stack", "module", "op")

    stack: Any
    module: ModuleContext | None
    op: str | None


class NodeOrigin:
    """An autograd node and where forward created it (resolved only when an error needs it)."""

    __slots__ = ("name", "stack", "module", "op")

    def __init__(self, name: str, stack: Any, module: ModuleContext | None, op: Any) -> None:
        self.name = name
        self.stack = stack  # a `capture_stack()` capture, or its resolution
        self.module = module
        self.op = op  # the aten op, or its name

    def site(self) -> Site:
        if isinstance(self.stack, tuple):
            frames, api, _ = self.stack
        else:
            frames, api, _ = resolve_stack(self.stack, SAVE_STACK)
        if self.op is None:  # a custom Function's node: its `apply` is the forward line's call
            op = f"{self.name.removesuffix('Backward')}.apply"
        else:
            op = self.op if isinstance(self.op, str) else op_name(self.op)
        return make_site(op, frames, api, self.module, "forward")


_BackwardCFunction = torch.autograd.function.BackwardCFunction


def save_for_backward_frame(node: Any) -> RawFrame | None:
    """The user's `ctx.save_for_backward(...)` line in a custom Function's `forward`: autograd packs
    what it saves only when `apply` returns, where the stack shows the `apply` call alone."""
    forward = getattr(getattr(node, "_forward_cls", None), "forward", None)
    try:
        code = getattr(inspect.unwrap(forward), "__code__", None) if forward is not None else None
    except ValueError:  # a wrapper loop
        return None
    return _save_line(code.co_filename, code) if code is not None else None


@functools.lru_cache(maxsize=256)
def _save_line(file: str, code: Any) -> RawFrame | None:
    """(file, line, name) of the one `save_for_backward` call in `code`'s source, when the file is the
    user's and there is exactly one; None otherwise. Keyed by the code object, which holds no globals
    (a function would keep the script's namespace, and its tensors, alive), and its file: equal code
    objects from two files compare equal."""
    if not is_user_file(file):
        return None
    try:
        lines, first = inspect.getsourcelines(code)
        tree = parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return None
    calls = [
        n.lineno for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "save_for_backward"
    ]
    return (file, first + calls[0] - 1, code.co_name) if len(calls) == 1 else None


def record_creation(node: Any, module: ModuleContext | None, op: Any, stack: Any = None) -> None:
    """Called by the node-creation hook: remember in the node where it was created (`stack`: a
    capture made in this hook already, else one is). Kept as a tuple: `origin_of` makes the
    `NodeOrigin` only for the node an error names. (The fast tracer calls it only for nodes that
    save none of our records: `origin_of` reads the others' there.)"""
    try:
        if stack is None:  # `capture_stack()`, inlined: this runs for every node that saves none of ours
            stack = _stacks.capture()
        node.metadata[NODE_KEY] = (stack, module, op)
    except (AttributeError, RuntimeError, TypeError):  # a node type without metadata
        pass


def origin_of(node: Any) -> NodeOrigin | None:
    """Where `node` was created, if the tracer saw it created."""
    try:
        metadata = node.metadata
    except (AttributeError, RuntimeError, TypeError):
        return None
    created = metadata.get(NODE_KEY)
    if type(created) is NodeOrigin:
        return created
    saved = None
    if created is None:
        saved = _made_at(node)
        if saved is None:
            return None
        created = (saved.stack, saved.module, saved.op)
    stack, module, op = created
    if isinstance(node, _BackwardCFunction):
        op = None  # the last aten op was inside the Function's forward, not the call itself
    name = node.name().rsplit("::", 1)[-1]  # `torch::autograd::CopySlices` -> `CopySlices`
    origin = NodeOrigin(name, stack, module, op)
    if saved is None:
        metadata[NODE_KEY] = origin  # made once: deep mode asks at every op
    return origin


def _made_at(node: Any) -> MadeAt | None:
    """The first of `node`'s saved tensors that a record of ours holds: where the node was made."""
    for attr, _ in saved_attrs(node):
        try:
            raw = getattr(node, attr)
        except RuntimeError:  # already freed
            continue
        for saved in raw if isinstance(raw, (tuple, list)) else (raw,):
            record = saved.data if isinstance(saved, _compat.SavedTensor) else None
            if isinstance(record, MadeAt):
                return record
    return None


_saved_attr_cache: dict[type, tuple[tuple[str, str], ...]] = {}  # autograd's own node types: they live as long as torch
# A custom Function's node type holds the Function, its `forward` and that function's globals (a
# script's namespace, its model and tensors): remembered weakly, so the program's objects go with it.
_custom_attr_cache: weakref.WeakKeyDictionary[type, tuple[tuple[str, str], ...]] = weakref.WeakKeyDictionary()


def saved_attrs(node: Any) -> tuple[tuple[str, str], ...]:
    """(`_raw_saved_<field>` attribute, field) of each tensor field a node type saves."""
    cls = type(node)
    attrs = _saved_attr_cache.get(cls)
    if attrs is None:
        custom = isinstance(node, _BackwardCFunction)
        attrs = _custom_attr_cache.get(cls) if custom else None
        if attrs is None:
            prefix = _compat.RAW_SAVED_PREFIX
            attrs = tuple((a, a[len(prefix) :]) for a in dir(node) if a.startswith(prefix))
            (_custom_attr_cache if custom else _saved_attr_cache)[cls] = attrs
    return attrs


def saved_objects(node: Any) -> Iterator[tuple[str, Any]]:
    """(where, saved-tensor object) of each tensor `node` still holds: `field`, or `field[i]` for a
    list field's i-th; a field already freed (backward ran) holds none."""
    for attr, field in saved_attrs(node):
        try:
            raw = getattr(node, attr)
        except RuntimeError:  # freed
            continue
        if isinstance(raw, _SavedTensor):
            yield field, raw
        elif isinstance(raw, (tuple, list)):
            yield from ((f"{field}[{i}]", saved) for i, saved in enumerate(raw) if isinstance(saved, _SavedTensor))


_ENGINE_FILE = os.path.join("torch", "autograd", "graph.py")


def not_reached(node: Any | None, stands: Callable[[Any], bool], limit: int = 100_000) -> tuple[frozenset[int], bool]:
    """The keys of the records (those `stands` keeps) the saved-tensor hooks packed for the nodes a
    backward that stopped at `node` had not run: those of its whole graph (from the roots
    `backward`/`grad` was called with, found in this thread's frames), or, when they are not found
    (a device thread runs it), those under `node` (nothing under a node runs before it); and
    whether the whole graph was found."""
    roots = _backward_roots()
    return _kept_under(roots if roots is not None else [node], stands, limit), roots is not None


def _backward_roots() -> list[Any] | None:
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_engine_run_backward" and code.co_filename.endswith(_ENGINE_FILE):
            outputs = _compat.frame_locals(frame).get("t_outputs")
            if not isinstance(outputs, (tuple, list)):
                return None
            # a tensor's node, or a GradientEdge's
            return [o.grad_fn if isinstance(o, torch.Tensor) else getattr(o, "node", None) for o in outputs]
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _kept_under(nodes: list[Any], stands: Callable[[Any], bool], limit: int) -> frozenset[int]:
    seen: dict[int, Any] = {}  # id -> node, held while walking: no id is reused meanwhile
    todo = list(nodes)
    keys: set[int] = set()
    while todo and len(seen) < limit:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen[id(current)] = current
        for _, saved in saved_objects(current):
            if stands(held := saved.data):
                keys.add(held.key)
        todo.extend(next_node for next_node, _ in getattr(current, "next_functions", ()))
    return frozenset(keys)


def custom_backward_in_traceback(tb: TracebackType | None) -> NodeOrigin | None:
    """The custom Function node whose Python `backward` the traceback ran through (innermost)."""
    found = None
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "apply" and frame.f_code.co_filename.endswith(_FUNCTION_FILE):
            node = _compat.frame_locals(frame).get("self")
            if isinstance(node, _BackwardCFunction):
                found = origin_of(node) or found
        tb = tb.tb_next
    return found


_RETURNED = re.compile(r"Function (\w+) returned an invalid gradient at index (\d+) - (.*)", re.S)


def in_user_terms(error: BaseException, node: str) -> str:
    """PyTorch's backward error in the words of the forward it came from."""
    said = printable_text(error)  # None: a user's exception whose __str__ raises
    text = said.splitlines()[0] if said else type(error).__name__
    found = _RETURNED.search(text)
    if found:
        return (
            f"{found[1]} returned a wrong gradient for input {found[2]} of its forward: {found[3]} "
            "(each gradient must have the shape and dtype of the input it is for)"
        )
    return f"{type(error).__name__} in {node}: {text}"
