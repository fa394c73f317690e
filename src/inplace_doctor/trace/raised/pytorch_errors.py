"""Errors PyTorch raises in a traced run: where they happened, and PyTorch's own stale-tensor wording."""

from __future__ import annotations

import itertools
import re
from typing import Any

import torch

from ... import _compat
from ...events import BackwardErrorCaught, InplaceErrorRaised
from ..ops import op_name
from ..places.modules import ModuleContext
from ..places.nodes import NodeOrigin, custom_backward_in_traceback, origin_of
from ..places.stacks import (
    capture_frames,
    checkpoint_in_traceback,
    frames_from_traceback,
    inplace_op_in_traceback,
    make_site,
)
from .blame import printable_text
from .raised_at import augmented_op_raised_at, receiver_raised_at

# What Python's augmented assignment calls on a tensor, by the in-place op it is.
_AUGMENTED_METHODS = {
    "__iadd__": "add_", "__isub__": "sub_", "__imul__": "mul_", "__itruediv__": "div_",
    "__ifloordiv__": "floor_divide_", "__imod__": "remainder_", "__ipow__": "pow_",
    "__iand__": "bitwise_and_", "__ior__": "bitwise_or_", "__ixor__": "bitwise_xor_",
}


class RaisedErrors:
    """What the tracer notes when an exception passes through it, to say later where it was raised.

    Both are kept by the exception's id: holding the exception would hold its
    traceback's frames, the graph, and through our hooks the tracer: a cycle
    gc cannot see.
    """

    __slots__ = (
        "failed_op", "error_module", "failed_node", "last_node", "custom_nodes", "failed_call", "noted", "left",
        "in_backward",
    )

    def __init__(self) -> None:
        #: (id of the exception, the op that raised it), set by the dispatch mode
        self.failed_op: tuple[int, Any] | None = None
        #: (id of the exception, where the backward node it was raised in was created)
        self.failed_node: tuple[int, NodeOrigin | None] | None = None
        #: the node whose backward ran the last op the dispatch mode saw in backward
        self.last_node: NodeOrigin | None = None
        #: the fast tracer, which sees no op in backward: the last custom Function node made under
        #: each name, where it was made (autograd names it when the gradient it returned is invalid)
        self.custom_nodes: dict[str, NodeOrigin | None] = {}
        #: (id of the exception, the method called, where its tensor's autograd node was created):
        #: a call autograd refused before any op (a view's in-place check), set by the function mode
        self.failed_call: tuple[int, str, NodeOrigin | None] | None = None
        #: (id of the exception, the module running when it left the tracer), set on exit
        self.error_module: tuple[int, ModuleContext | None] | None = None
        #: each error an in-place call raised -> the event that says where (`note`): those that
        #: never leave the traced code were caught by the program (`caught`)
        self.noted: dict[int, InplaceErrorRaised] = {}  # by the serial `note` sets on the exception
        self.left: set[int] = set()  # the noted errors that left the traced code (not caught there)
        #: PyTorch's errors the tool raised in backward at an overwritten saved tensor -> the keys of
        #: the findings they confirmed (`Finding.dedupe_key`), by the same serial
        self.in_backward: dict[int, tuple[Any, ...]] = {}

    def call_raised(self, exc: BaseException, func: Any, target: torch.Tensor, flag: bool = False) -> str | None:
        """See `TraceOwner.call_raised`; kept only for an in-place call (`mul_`, `x += y`, `x[i] = v`,
        `inplace=True`), whose op (`aten.mul_`) it returns."""
        name = getattr(func, "__name__", "")
        op = in_place_name(name, flag)
        if op is None:
            return None
        node = target.grad_fn if target.requires_grad else None
        self.failed_call = (id(exc), op, origin_of(node) if node is not None else None)
        return f"aten.{op}"

    def note(self, exc: BaseException, op: str, target: torch.Tensor | None, module: ModuleContext | None) -> None:
        """An in-place call raised `exc` (PyTorch refused it): where, taken now, from the live stack.
        Kept by a serial number set on the exception (an id is reused as soon as a caught one is
        freed), with a copy of it (the exception itself holds its frames)."""
        if not isinstance(exc, RuntimeError):
            return
        key = _serial_of(exc)
        if key in self.noted:
            return
        if len(self.noted) >= _MAX_NOTED:
            return
        frames, api = capture_frames()
        phase = "backward" if _compat.current_autograd_node() is not None else "forward"
        site = make_site(op, frames, api, module, phase)
        self.noted[key] = InplaceErrorRaised(
            _copy_of(exc), site, checkpoint_in_traceback(exc.__traceback__),
            target_created=created.site() if (created := _created(target)) is not None else None, caught=True,
        )

    def noting(self, modules: Any, busy: Any) -> Any:
        """`note` for wrappers that know no module: the running one then, unless the tool is busy."""

        def note(exc: BaseException, op: str, target: torch.Tensor | None) -> None:
            if not busy.on:
                self.note(exc, op, target, modules.current)

        return note

    def raised_in_backward(self, exc: BaseException, findings: Any) -> None:
        """The tool raised `exc` (PyTorch's stale-tensor error) in backward for `findings`."""
        if len(self.in_backward) < _MAX_NOTED:
            self.in_backward[_serial_of(exc)] = tuple(f.dedupe_key for f in findings)

    def take(self, exc: BaseException) -> InplaceErrorRaised | None:
        """The note of `exc`, handed out once (not among the `caught` ones after)."""
        key = getattr(exc, _SERIAL, 0)
        self.in_backward.pop(key, None)
        return self.noted.pop(key, None)

    def forget(self, exc: BaseException) -> None:
        """`exc` left the traced code (and what it was raised from, or during): the program did not
        catch it (its own path reports it)."""
        seen: set[int] = set()
        chained: BaseException | None = exc
        while chained is not None and id(chained) not in seen:
            seen.add(id(chained))
            key = getattr(chained, _SERIAL, None)
            if key is not None:
                self.left.add(key)
            chained = chained.__cause__ or chained.__context__

    def caught(self, leaving: BaseException | None) -> list[InplaceErrorRaised | BackwardErrorCaught]:
        """The noted errors the program caught: all but those that left (`leaving` among them; kept
        for `describe`); forgotten once handed out. Those of backward, as the findings they confirmed."""
        if leaving is not None:
            self.forget(leaving)
        events: list[InplaceErrorRaised | BackwardErrorCaught] = [
            event for key, event in self.noted.items() if key not in self.left
        ]
        events += [BackwardErrorCaught(keys) for key, keys in self.in_backward.items() if key not in self.left]
        self.noted = {key: event for key, event in self.noted.items() if key in self.left}
        self.in_backward.clear()
        self.left &= self.noted.keys()
        return events

    def describe(self, exc: BaseException, current_module: ModuleContext | None) -> InplaceErrorRaised:
        """Where `exc`, raised inside the traced code, happened; `current_module` is the module stack's top now.
        It left the traced code: not caught there (`forget`)."""
        self.forget(exc)
        noted = self.noted.get(getattr(exc, _SERIAL, 0))  # the call that raised it, seen as it did
        frames, api = frames_from_traceback(exc.__traceback__)
        call = self.failed_call if self.failed_call is not None and self.failed_call[0] == id(exc) else None
        if self.failed_op is not None and self.failed_op[0] == id(exc):
            op = op_name(self.failed_op[1])
        else:  # raised above the dispatcher (autograd's view and leaf checks)
            op = (
                inplace_op_in_traceback(exc.__traceback__) or (call[1] if call else None)
                or augmented_op_raised_at(exc.__traceback__) or (noted.site.op if noted else "<in-place op>")
            )
        if self.error_module is not None and self.error_module[0] == id(exc):
            module = self.error_module[1]
        else:  # still inside the run: the module stack is as the error left it
            module = current_module
        phase = "forward"
        site = make_site(op, frames, api, module, phase)
        node = self._failing_node(exc)
        if call is not None:
            target = call[2]
        elif noted is not None:  # the fast tracer's wrapper saw the call: its receiver's node, read then
            target = None
        else:  # no function mode: the receiver of the call that raised, if plain
            target = _created(receiver_raised_at(exc.__traceback__))
        return InplaceErrorRaised(
            exc, site, checkpoint_in_traceback(exc.__traceback__),
            node=node.name if node is not None else None,
            created=node.site() if node is not None else None,
            target_created=target.site() if target is not None else noted.target_created if noted else None,
        )

    def _failing_node(self, exc: BaseException) -> NodeOrigin | None:
        """The backward node `exc` was raised in, where the tracer saw it created: the node of
        the op that raised, a custom Function's Python backward, or the node autograd names
        after running it (an invalid gradient it returned)."""
        if self.failed_node is not None and self.failed_node[0] == id(exc):
            return self.failed_node[1]
        custom = custom_backward_in_traceback(exc.__traceback__)
        if custom is not None:
            return custom
        text = printable_text(exc) or ""  # a user's exception whose __str__ raises names no node
        last = self.last_node
        if last is not None and f"Function {last.name} returned" in text:
            return last
        for name, origin in self.custom_nodes.items():
            if f"Function {name} returned" in text:
                return origin
        return None


_SERIAL = "_inplace_doctor_noted"  # set on an exception a session noted: which note it is
_serials = itertools.count(1)
_MAX_NOTED = 256  # errors kept between two reports: a loop that catches one at every step repeats its line


def _serial_of(exc: BaseException) -> int:
    """The serial number `RaisedErrors` knows `exc` by, set on it the first time."""
    key = getattr(exc, _SERIAL, None)
    if key is None:
        key = next(_serials)
        setattr(exc, _SERIAL, key)
    return int(key)


def in_place_name(name: str, flag: bool = False) -> str | None:
    """The in-place op a called function's `name` is (`mul_`, `__iadd__` -> `add_`, `__setitem__`,
    `relu` with `inplace=True` -> `relu_`), or None for a call that writes nothing in place."""
    if flag:
        return name if name.endswith("_") else f"{name}_"
    if name == "__setitem__":
        return name
    return _AUGMENTED_METHODS.get(name) or (name if name.endswith("_") and not name.startswith("__") else None)


def _copy_of(exc: BaseException) -> BaseException:
    """`exc`'s type and message, without its traceback (which would hold the program's frames)."""
    try:
        copy = type(exc)(*exc.args)
    except Exception:  # a subclass whose __init__ takes other arguments
        copy = RuntimeError(*exc.args)
    return copy


def _created(t: torch.Tensor | None) -> NodeOrigin | None:
    """Where the autograd node of `t` was created, as `call_raised` keeps it."""
    node = t.grad_fn if t is not None and t.requires_grad else None
    return origin_of(node) if node is not None else None


def written_here(error: BaseException) -> BaseException | None:
    """The `WrittenHere` a rule attached to its error (where the write ran), to chain in front of it."""
    return getattr(error, "written_here", None)


def is_stale_saved_tensor_error(error: BaseException | str) -> bool:
    """Whether `error` is PyTorch's "modified by an inplace operation" (a saved tensor changed
    before backward read it), in its wording or ours (`pytorch_stale_message`)."""
    text = error if isinstance(error, str) else printable_text(error) or ""
    return "modified by an inplace operation" in text.lower()


def named_output(record: Any, node: Any) -> tuple[int, str] | None:
    """(output number, node name) as PyTorch's stale-tensor message names them for a saved tensor's
    `record` (`saved.SavedRecord`): a saved output (`result`, `result1`) is output N of `node`, the
    one running its backward; any other saved tensor is an output of its own node as it is now (an
    in-place op made it the output of its own); a leaf, of none."""
    field = record.field or ""
    if node is not None and field.startswith("result") and (field == "result" or field[6:].isdigit()):
        return (int(field[6:]) if field[6:] else record.output_nr), node.name()
    t = record.original() if record.original is not None else None
    if t is None:  # dropped since: what autograd made of it then
        if record.view and record.grad and not torch._C._is_view_replay_enabled():
            return 0, "AsStridedBackward0"  # a view whose base changed gets a fresh node on its next read
        return None  # (a tensor written in place, then dropped, is the output of a node we cannot name)
    grad_fn = t.grad_fn
    return (record.output_nr, grad_fn.name()) if grad_fn is not None else None  # a leaf: no node


def pytorch_stale_message(t: torch.Tensor, output: tuple[int, str] | None, version: int, expected: int) -> str:
    """PyTorch's own message for a stale saved tensor, word for word (its check is off under our
    hooks, so the tool raises it): `output` is (output number, node name) where PyTorch names the
    node the tensor is an output of, None where it names none (a leaf)."""
    strips, hint = _stale_wording()
    clause = ""
    if output is not None:
        number, name = output
        clause = f", which is output {number} of {_BACKWARD_SUFFIX.sub(_forward_name, name) if strips else name},"
    if torch.is_anomaly_enabled():
        hint = _ANOMALY_HINT
    return (
        "one of the variables needed for gradient computation has been modified by an inplace operation: "
        f"[{t.type()} {list(t.shape)}]{clause} is at version {version}; expected version {expected} instead.{hint}"
    )


_BACKWARD_SUFFIX = re.compile(r"Backward(\d*)$")


def _forward_name(found: re.Match[str]) -> str:
    """`ExpBackward0` -> `Exp`, `PowBackward1` -> `Pow1`, `MyFnBackward` -> `MyFn`, as torch names them."""
    return "" if found[1] == "0" else found[1]
_ANOMALY_HINT = (
    " Hint: the backtrace further above shows the operation that failed to compute its gradient. "
    "The variable in question was changed in there or anywhere later. Good luck!"
)


def _stale_wording() -> tuple[bool, str]:
    """(whether this torch names a node without its `Backward0` suffix, the hint it ends with, anomaly
    mode off): read at import from a stale saved tensor of torch's own (the wording changes between
    releases), before any session's hooks would switch its check off."""
    return _WORDING


def _probe_wording() -> tuple[bool, str]:
    fallback = (True, " Hint: enable anomaly detection to find the operation that failed to compute its gradient, "
                "with torch.autograd.set_detect_anomaly(True, check_nan=False).")
    try:
        with torch._C._DisableTorchDispatch(), torch.autograd.graph.disable_saved_tensors_hooks("probe"), \
                torch.enable_grad(), torch.autograd.set_detect_anomaly(False):
            x = torch.ones(1, requires_grad=True)
            y = x.exp()
            y.add_(1)
            y.backward()
    except RuntimeError as e:
        text = str(e)
        if ", which is output 0 of " in text and "instead." in text:
            strips = ", which is output 0 of Exp," in text
            return strips, text[text.index("instead.") + len("instead."):]
    return fallback


_WORDING = _probe_wording()
