"""Errors PyTorch raises in a traced run: where they happened, and PyTorch's own stale-tensor wording."""

from __future__ import annotations

from typing import Any

import torch

from ..events import InplaceErrorRaised
from .modules import ModuleContext
from .nodes import NodeOrigin, custom_backward_in_traceback, origin_of
from .ops import op_name
from .raised_at import augmented_op_raised_at, receiver_raised_at
from .stacks import checkpoint_in_traceback, frames_from_traceback, inplace_op_in_traceback, make_site


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

    __slots__ = ("failed_op", "error_module", "failed_node", "last_node", "custom_nodes", "failed_call")

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

    def call_raised(self, exc: BaseException, func: Any, target: torch.Tensor) -> None:
        """See `TraceOwner.call_raised`; kept only for an in-place method (`mul_`, `clamp_`)."""
        name = getattr(func, "__name__", "")
        op = _AUGMENTED_METHODS.get(name) or (name if name.endswith("_") and not name.startswith("__") else None)
        if op is None:
            return
        node = target.grad_fn if target.requires_grad else None
        self.failed_call = (id(exc), op, origin_of(node) if node is not None else None)

    def describe(self, exc: BaseException, current_module: ModuleContext | None) -> InplaceErrorRaised:
        """Where `exc`, raised inside the traced code, happened; `current_module` is the module stack's top now."""
        frames, api = frames_from_traceback(exc.__traceback__)
        call = self.failed_call if self.failed_call is not None and self.failed_call[0] == id(exc) else None
        if self.failed_op is not None and self.failed_op[0] == id(exc):
            op = op_name(self.failed_op[1])
        else:  # raised above the dispatcher (autograd's view and leaf checks)
            op = (
                inplace_op_in_traceback(exc.__traceback__) or (call[1] if call else None)
                or augmented_op_raised_at(exc.__traceback__) or "<in-place op>"
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
        else:  # no function mode (the fast tracer): the receiver of the call that raised, if plain
            target = _created(receiver_raised_at(exc.__traceback__))
        return InplaceErrorRaised(
            exc, site, checkpoint_in_traceback(exc.__traceback__),
            node=node.name if node is not None else None,
            created=node.site() if node is not None else None,
            target_created=target.site() if target is not None else None,
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
        last = self.last_node
        if last is not None and f"Function {last.name} returned" in str(exc):
            return last
        text = str(exc)
        for name, origin in self.custom_nodes.items():
            if f"Function {name} returned" in text:
                return origin
        return None


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
    return "modified by an inplace operation" in str(error).lower()


def pytorch_stale_message(t: torch.Tensor, node: str | None, version: int, expected: int) -> str:
    """PyTorch's own wording for a stale saved tensor (its check is off under our hooks)."""
    shape = list(t.shape)
    return (
        "one of the variables needed for gradient computation has been modified by an inplace "
        f"operation: [{t.type()} {shape}], which is saved by {node or 'an autograd node'}, is at "
        f"version {version}; expected version {expected} instead."
    )
