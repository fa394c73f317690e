"""What decides an IPD110 prediction at backward: the gradient that reaches the written positions, and
which reads of the written tensor are uses at all.

A write autograd did not record changes a graph tensor `h`; the gradients that flow back through `h`'s
history are computed as if the write had not happened. They differ from the out-of-place program's
only at the positions the write changed: the out-of-place `h.masked_fill(mask, v)` sends no gradient
to `mask`'s positions, `h * 2` twice the gradient. Where the gradient reaching `h` is exactly zero at
every written position (a `-inf` mask before a softmax: softmax's output, and so its gradient, is
exactly 0 there), both programs compute the same gradients and the write is harmless.

- `written_positions`: which elements of the graph tensor a write changed, as a boolean tensor of the
  graph tensor's shape, from the op's own arguments (`masked_fill_`'s mask, `index_put_`'s indices;
  every element of the written view otherwise). None when the elements do not line up (a view of
  another dtype) or the map would pass 2**27 elements: the prediction is then confirmed when backward
  runs through the use.
- `GradientCheck`: the pre-hook on the graph tensor's node (the tensor itself may be gone by backward:
  `s = softmax(s)`) that reads the gradient at those positions once backward has run through the use.
  It returns None (the gradient is never changed) and holds no tensor of the user's: the positions are
  the tool's own tensor, dropped once read.
- `function_forwards`/`through_function`: a write inside a custom `autograd.Function`'s forward (a
  temporal shift through `.data`) is that Function's business for the tensors it returns, whose
  backward it defines; a use is a read of the changed values outside it (`out += identity`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

import torch

from ..owner import Busy

_INDEX_PUT = torch.ops.aten.index_put_.default
_MASKED = frozenset({
    torch.ops.aten.masked_fill_.Scalar,
    torch.ops.aten.masked_fill_.Tensor,
    torch.ops.aten.masked_scatter_.default,
})
_FRAMES = 64  # frames looked at for a custom Function's forward around a watched write
_VIEW_STEPS = 8  # view nodes walked from a tensor to the node whose output it views
_MAX_ELEMENTS = 1 << 27  # a position map past this (128 MiB of bools) is not made: backward through the use confirms


def written_positions(func: Any, args: Any, written: torch.Tensor, root: torch.Tensor) -> torch.Tensor | None:
    """The elements of `root` that `func` wrote through `written` (a view or alias of `root`'s memory),
    as a boolean tensor of `root`'s shape; None when they cannot be told apart."""
    if written.dtype.itemsize != root.dtype.itemsize or written.device != root.device or root.is_sparse:
        return None
    try:
        which: torch.Tensor | None = None  # None: every element of the written view
        if func in _MASKED and len(args) > 1 and isinstance(args[1], torch.Tensor):
            which = args[1].to(device=written.device, dtype=torch.bool).expand(written.shape)
        elif func is _INDEX_PUT and len(args) > 1:
            which = torch.zeros(written.shape, dtype=torch.bool, device=written.device)
            _INDEX_PUT(which, list(args[1]), torch.ones((), dtype=torch.bool, device=written.device))
        low = min(written.storage_offset(), root.storage_offset())
        high = max(_end(written), _end(root))
        if high - low > _MAX_ELEMENTS:
            return None
        flat = torch.zeros(max(high - low, 0), dtype=torch.bool, device=root.device)
        if written.numel():
            view = flat.as_strided(written.shape, written.stride(), written.storage_offset() - low)
            if which is None:
                view.fill_(True)
            else:
                view.copy_(which)
        return flat.as_strided(root.shape, root.stride(), root.storage_offset() - low).clone()
    except (RuntimeError, IndexError, TypeError, ValueError):
        return None


def _end(t: torch.Tensor) -> int:
    """One past the last storage element `t` covers."""
    if t.numel() == 0:
        return int(t.storage_offset())
    return int(t.storage_offset()) + sum((int(n) - 1) * s for n, s in zip(t.shape, t.stride())) + 1


def function_forwards() -> tuple[CodeType, ...]:
    """The code of each `forward` running now that may be a custom `autograd.Function`'s (the write
    happens inside it): matched later against the `Function` of the nodes its outputs get."""
    codes = []
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_FRAMES):
        if frame is None:
            break
        if frame.f_code.co_name == "forward":
            codes.append(frame.f_code)
        frame = frame.f_back
    return tuple(codes)


def function_node(node: Any, forwards: tuple[CodeType, ...]) -> bool:
    """Whether `node` is the backward of a custom `autograd.Function` whose forward is one of `forwards`."""
    if not forwards or not isinstance(node, torch.autograd.function.BackwardCFunction):
        return False
    forward = getattr(getattr(node, "_forward_cls", None), "forward", None)
    for _ in range(_VIEW_STEPS):  # through decorators on forward (`functools.wraps`) to the code that ran
        if getattr(forward, "__code__", None) in forwards:
            return True
        forward = getattr(forward, "__wrapped__", None)
    return False


def through_function(t: torch.Tensor, forwards: tuple[CodeType, ...]) -> bool:
    """Whether `t` is an output of that Function, or a view of one: its gradient goes to the
    Function's own backward, which accounts for what its forward wrote."""
    node = t.grad_fn
    for _ in range(_VIEW_STEPS):
        if node is None:
            return False
        if function_node(node, forwards):
            return True
        if t._base is None:
            return False  # not a view: its node is the op that computed it, not a view's
        edges = node.next_functions
        node = edges[0][0] if edges else None
    return False


class GradientCheck:
    """The pre-hook on a changed graph tensor's node: once backward has run through the use, the
    gradient reaching the tensor (the node's output `output_nr`) says whether the write mattered.
    Never changes the gradient (returns None)."""

    __slots__ = ("positions", "output_nr", "decide", "busy", "reached", "__weakref__")

    def __init__(
        self, positions: torch.Tensor, output_nr: int, decide: Callable[[int, int], None], busy: Busy
    ) -> None:
        self.positions: torch.Tensor | None = positions
        self.output_nr = output_nr
        self.decide = decide  # called once: (written elements with non-zero gradient, written elements)
        self.busy = busy
        self.reached = False  # backward ran through the use (the gradient from earlier reads does not count alone)

    def __call__(self, grad_outputs: Any) -> None:
        positions = self.positions
        if not self.reached or positions is None:
            return None
        self.positions = None
        grad = grad_outputs[self.output_nr] if self.output_nr < len(grad_outputs) else None
        with self.busy:
            written = int(positions.sum())
            self.decide(_nonzero_at(grad, positions, written), written)
        return None


def _nonzero_at(grad: torch.Tensor | None, positions: torch.Tensor, written: int) -> int:
    """How many written positions `grad` is anything but exactly zero at (NaN counts as non-zero; no
    gradient at all is zero); all of them when it cannot be read there (another shape or layout): the
    write is then not cleared."""
    if grad is None:
        return 0
    if grad.shape != positions.shape or grad.layout != torch.strided:
        return max(written, 1)
    try:
        return int((grad.masked_select(positions.to(grad.device)) != 0).sum())
    except RuntimeError:
        return max(written, 1)
