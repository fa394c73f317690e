"""Writes autograd does not record into tensors of the graph, and the later ops that use them (IPD110).

`h.detach()[mask] = 0`, `h.data.mul_(2)` or `with torch.no_grad(): h.mul_(2)` on a non-leaf `h` that
requires grad change its value and leave its history as it was: an op that uses `h` afterwards with
grad on sends gradients back through that history as if the write had not happened. Nothing saved is
overwritten (the later op saves the new value), so neither PyTorch nor the saved-tensor rules notice.

How it is seen, at a cost only where such writes happen:

- `aten.detach` (what both `.detach()` and `.data` dispatch) of a non-leaf tensor that requires grad
  records its storage and a weak reference to that tensor (only detach ops pay);
- a forward write into such a storage by a tensor that does not require grad, or a write under
  `no_grad`/`inference_mode` into a non-leaf tensor itself, is *watched*. Leaves and views of leaves
  (parameters, buffers, a target network's weights) are not: their writes are updates, not activations;
- while a write is watched, each forward op with grad on looks at its tensor inputs that require grad
  and have history; the first on the written bytes is the *use*;
- at the next op the use's output has its autograd node (an op that records none, a comparison or
  `.item()`, is no use): a pre-hook on that node says when backward runs through the use, and its
  release without that (a value only logged, a graph dropped) withdraws the prediction;
- where the written elements can be told (`graph_gradients.written_positions`), a pre-hook on the
  graph tensor's node reads the gradient reaching them once backward has run through the use: non-zero
  confirms the prediction, exactly zero everywhere (a `-inf` mask before a softmax) clears it
  (`ChangedGraphTensorHarmless`, counted, not reported);
- a write inside a custom `autograd.Function`'s forward is that Function's for the tensors it returns
  (their gradient goes through its backward): reads through them are no use, a read of the written
  tensor past them is (a temporal shift's residual `out += identity`).

Known limitations: a use by `h.backward(g)` itself (no op takes `h`) is not seen; overlap is by bytes,
not elements; writes inside a `torch.utils.checkpoint` region are left to IPD108. The gradient check
reads the whole gradient reaching the graph tensor, including what ops that read it before the write
send there: non-zero gradient from such a read confirms the prediction.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from ...events import (
    ChangedGraphTensorFreed,
    ChangedGraphTensorHarmless,
    ChangedGraphTensorReached,
    Event,
    GraphTensorChangedOutsideAutograd,
    WriteInfo,
)
from ...sites import Site
from ..ops import op_name
from ..owner import Busy
from ..places.modules import ModulePaths
from ..places.stacks import MAX_STACK, capture_stack, make_site, resolve_stack
from ..saves.saved import SavedTensors
from ..saves.storage import storage_span
from .graph_gradients import GradientCheck, function_forwards, function_node, through_function, written_positions

_DETACH = torch.ops.aten.detach.default
_INDEX_PUT = torch.ops.aten.index_put_.default
# Writes that replace every element of the tensor they write: the old history gets no gradient through them.
_REPLACING = frozenset({torch.ops.aten.copy_.default, torch.ops.aten.fill_.Scalar, torch.ops.aten.zero_.default})
_MAX_DETACHED = 1024  # storages remembered; dead ones are dropped past this


def graph_root(t: torch.Tensor) -> torch.Tensor | None:
    """The non-leaf tensor `t` is (or views) when it requires grad and has history; None for leaves
    and views of leaves (parameters, buffers) and for tensors outside autograd. (A view made under
    `no_grad` has no `grad_fn` of its own but requires grad: its base decides.)"""
    if not t.requires_grad:
        return None
    root = t._base if t._base is not None else t
    return root if root.grad_fn is not None else None


class Watched:
    """A write autograd did not record, into the memory of a live non-leaf graph tensor."""

    __slots__ = ("info", "how", "span", "root", "history", "boolean_mask", "positions", "forwards", "target")

    def __init__(
        self, info: WriteInfo, how: str, span: tuple[int, int, int], root: torch.Tensor, boolean_mask: bool
    ) -> None:
        self.info = info
        self.how = how
        self.span = span
        self.root = weakref.ref(root)  # dead: the tensor and every view of it are gone
        grad_fn = root.grad_fn
        self.history = grad_fn.name() if grad_fn is not None else None
        self.boolean_mask = boolean_mask
        #: the written elements of `root` (the tool's own tensor), for the gradient check; None: not known
        self.positions: torch.Tensor | None = None
        #: the `forward`s running at the write: a custom Function's outputs are its own business
        self.forwards = function_forwards() if not torch.is_grad_enabled() else ()
        #: from the use to its prediction only: the node the changed tensor's gradient goes to, and which
        #: of its outputs the tensor is (the tensor itself may be gone by then: `s = softmax(s)`)
        self.target: tuple[Any, int] | None = None


class _ReachedHook:
    """The pre-hook on a use's node: backward running it confirms the prediction (once)."""

    __slots__ = ("owner", "event", "check", "__weakref__")

    def __init__(
        self, owner: UnrecordedWrites, event: GraphTensorChangedOutsideAutograd, check: GradientCheck | None
    ) -> None:
        self.owner = owner
        self.event = event
        self.check = check  # the gradient at the written positions decides, once it reaches the tensor

    def __call__(self, grad_outputs: Any) -> None:
        if self.check is not None:
            self.check.reached = True
            return
        self.owner.reached(self.event)


class UnrecordedWrites:
    """Watches writes autograd cannot record into graph tensors, and reports their first use (IPD110)."""

    def __init__(
        self,
        emit: Callable[[Event], None],
        modules: ModulePaths,
        saved: SavedTensors,
        write_info: Callable[[Any, torch.Tensor], WriteInfo],
        busy: Busy,
    ) -> None:
        self._emit = emit
        self._busy = busy
        self._modules = modules
        self._saved = saved
        self._write_info = write_info
        #: storage key -> the graph tensor a `.detach()`/`.data` alias was made of
        self._detached: dict[int, weakref.ref[torch.Tensor]] = {}
        self.watching: list[Watched] = []
        #: uses seen, waiting for their node (set once the op returns): (write, use, the op's outputs)
        self.awaiting: list[tuple[Watched, Site, list[weakref.ref[torch.Tensor]]]] = []
        #: set by `check_uses` for the op running now: the dispatch mode calls `after_op` when it is
        self.used: tuple[list[Watched], Site] | None = None
        self._predicted = 0
        #: key -> (hook handle, release finalizer, gradient hook handle) of predictions backward has not settled
        self._hooks: dict[int, tuple[Any, Any, Any]] = {}

    # -- the dispatch mode's calls (forward only) ---------------------------------
    def detached(self, source: Any) -> None:
        """`aten.detach` ran on `source`: remember its storage if it is a graph tensor."""
        if not isinstance(source, torch.Tensor) or graph_root(source) is None:
            return
        span = storage_span(source)
        if span is None:
            return
        if len(self._detached) > _MAX_DETACHED:
            self._detached = {k: ref for k, ref in self._detached.items() if ref() is not None}
        self._detached[span[0]] = weakref.ref(source)

    def written(self, func: Any, args: Any, written: list[torch.Tensor]) -> None:
        """An op wrote `written` in forward: watch the writes autograd did not record into graph tensors."""
        for t in written:
            if t.requires_grad:
                if torch.is_grad_enabled():
                    continue  # autograd records it: the in-place rules' business
                root = graph_root(t)
                if root is None:
                    continue  # a leaf or a view of one: parameter updates, init, EMA, clamping
                how = "inference_mode" if torch.is_inference_mode_enabled() else "no_grad"
                span = storage_span(t)
            else:
                if not self._detached:
                    continue
                span = storage_span(t)
                ref = self._detached.get(span[0]) if span is not None else None
                source = ref() if ref is not None else None
                if source is None or span is None or not _overlaps(span, storage_span(source)):
                    continue
                root = graph_root(source)
                if root is None:
                    continue
                how = "alias"
            if span is None or self._saved_on(span):
                continue  # a tensor saved for backward is on these bytes: IPD101/IPD104 say more
            info = self._write_info(func, t)
            if info.in_checkpoint:
                continue  # a checkpointed region writing under its own no_grad: IPD108 explains it
            if how == "alias":
                how = "data" if ".data" in (info.site.code or "") else "detach"
            watched = Watched(info, how, span, root, _boolean_mask(func, args))
            with self._busy:
                watched.positions = written_positions(func, args, t, root)
            self.watching.append(watched)

    def check_uses(self, func: Any, args: Any, kwargs: Any, written: list[torch.Tensor] | None) -> None:
        """Before an op with grad on: does it take watched graph tensors? (The first such op is each one's use.)"""
        self.watching = [w for w in self.watching if w.root() is not None]
        if not self.watching or not torch.is_grad_enabled():
            return
        used: list[Watched] = []
        for u in _tensor_inputs(args, kwargs):
            if not u.requires_grad or graph_root(u) is None:
                continue
            if written and func in _REPLACING and any(u is t for t in written):
                continue  # replaced whole, with grad on: the old history gets no gradient from here
            span = storage_span(u)
            if span is None:
                continue
            used += [
                w for w in self.watching
                if w not in used and _overlaps(w.span, span) and not (w.forwards and through_function(u, w.forwards))
            ]
        if used:
            for w in used:
                root = w.root() if w.positions is not None else None
                if root is not None and root.grad_fn is not None:
                    w.target = (root.grad_fn, root.output_nr)
            self.watching = [w for w in self.watching if w not in used]
            self.used = (used, self._use_site(func))

    def after_op(self, out: Any) -> None:
        """The op that used a watched tensor returned: its outputs get their node at the next op."""
        used, self.used = self.used, None
        if used is None:
            return
        if isinstance(out, torch.Tensor):
            outs = [out]
        else:
            outs = [o for o in out if isinstance(o, torch.Tensor)] if isinstance(out, (tuple, list)) else []
        refs = [weakref.ref(o) for o in outs]
        self.awaiting += [(w, used[1], refs) for w in used[0]]

    def resolve(self) -> None:
        """The uses' nodes exist now: predict each, and watch backward run (or free) the node."""
        awaiting, self.awaiting = self.awaiting, []
        for watched, use, outs in awaiting:
            node = next((o.grad_fn for ref in outs if (o := ref()) is not None and o.grad_fn is not None), None)
            # No history recorded (a comparison, `.item()`), a result dropped at once, or the output of the
            # custom Function whose forward wrote (its backward accounts for the write): no use.
            if node is None or function_node(node, watched.forwards):
                watched.target = None
                if watched.root() is not None:
                    self.watching.append(watched)  # nothing flowed through this op: the next use counts
                continue
            self._predicted += 1
            event = GraphTensorChangedOutsideAutograd(
                write=watched.info, use=use, how=watched.how, history=watched.history,
                key=-self._predicted, boolean_mask=watched.boolean_mask,
            )
            self._emit(event)
            check, gradient_handle = self._gradient_check(watched, event)
            hook = _ReachedHook(self, event, check)
            try:
                handle = node.register_prehook(hook)
            except (AttributeError, RuntimeError):  # a node type without hooks: it stays a prediction
                if gradient_handle is not None:
                    gradient_handle.remove()
                continue
            release = weakref.finalize(hook, self._freed, event.key)
            self._hooks[event.key] = (handle, release, gradient_handle)

    def _gradient_check(
        self, watched: Watched, event: GraphTensorChangedOutsideAutograd
    ) -> tuple[GradientCheck | None, Any]:
        """A pre-hook on the changed graph tensor's node that decides by the gradient at the written
        positions (with its handle); (None, None) where they are not known (backward through the use
        then confirms)."""
        target, positions = watched.target, watched.positions
        watched.target = watched.positions = None
        if target is None or positions is None:
            return None, None
        node, output_nr = target
        check = GradientCheck(positions, output_nr, lambda n, written: self._decided(event, n, written), self._busy)
        try:
            return check, node.register_prehook(check)
        except (AttributeError, RuntimeError):  # a node that takes no hooks: backward through the use confirms
            return None, None

    # -- backward -----------------------------------------------------------------
    def reached(self, event: GraphTensorChangedOutsideAutograd) -> None:
        """Backward ran the use's node (its pre-hook, which stays: a hook is not removed from inside)."""
        if self._settle(event.key, in_use_node=True):
            self._emit(ChangedGraphTensorReached(event))

    def _decided(self, event: GraphTensorChangedOutsideAutograd, nonzero: int, written: int) -> None:
        """The gradient reached the changed tensor (from the hook on its node, which stays, emptied)."""
        if self._settle(event.key, in_use_node=False):
            self._emit(
                ChangedGraphTensorReached(event, nonzero, written) if nonzero else ChangedGraphTensorHarmless(event.key)
            )

    def _settle(self, key: int, in_use_node: bool) -> bool:
        """Take a prediction off the books (and the use node's pre-hook, when not running inside it);
        False when it was settled already (a second backward through a retained graph)."""
        entry = self._hooks.pop(key, None)
        if entry is None:
            return False
        handle, release, _ = entry
        release.detach()
        if not in_use_node:
            handle.remove()
        return True

    def _freed(self, key: int) -> None:
        entry = self._hooks.pop(key, None)
        if entry is not None:
            if entry[2] is not None:
                entry[2].remove()
            self._emit(ChangedGraphTensorFreed(key))

    def clear(self) -> None:
        """The run ended: stop watching, and take the hooks off nodes that outlive it."""
        if self.awaiting:
            self.resolve()
        hooks, self._hooks = self._hooks, {}
        for handle, release, gradient_handle in hooks.values():
            release.detach()
            handle.remove()
            if gradient_handle is not None:
                gradient_handle.remove()
        self._detached = {}
        self.watching = []
        self.used = None

    def _saved_on(self, span: tuple[int, int, int]) -> bool:
        bucket = self._saved.by_storage.get(span[0])
        if not bucket:
            return False
        return any((r := ref()) is not None and _overlaps(span, r.span()) for ref in bucket.values())

    def _use_site(self, func: Any) -> Site:
        frames, api, _ = resolve_stack(capture_stack(), MAX_STACK)
        return make_site(op_name(func), frames, api, self._modules.current, "forward")


def _tensor_inputs(args: Any, kwargs: Any) -> list[torch.Tensor]:
    """The op's tensor arguments, and those in a list argument (`cat`, `stack`)."""
    found = []
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            found.extend(x for x in a if isinstance(x, torch.Tensor))
    return found


def _boolean_mask(func: Any, args: Any) -> bool:
    """`t[mask] = v`: `index_put_` with one boolean index (what `masked_fill` rewrites)."""
    if func is not _INDEX_PUT or len(args) < 2:
        return False
    indices = args[1]
    return (
        isinstance(indices, (list, tuple))
        and len(indices) == 1
        and isinstance(indices[0], torch.Tensor)
        and indices[0].dtype == torch.bool
    )


def _overlaps(a: tuple[int, int, int], b: tuple[int, int, int] | None) -> bool:
    return b is not None and a[0] == b[0] and a[1] < b[2] and b[1] < a[2]
