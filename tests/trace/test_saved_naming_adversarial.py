"""The fast tracer names a saved tensor's node, field and op as the deep tracer does, whatever
order node types are first met in (`trace/fast/saved_fast.py`'s layouts, learnt once per process).

Each program runs under `watch(deep=True)` and `watch(deep=False)`; every finding must agree on
its code, the lines that wrote and saved, the saved op, the slot (`Node.field`), whether backward
confirmed it, and the message. Each output gets its own backward, so that one error does not keep
the others from confirming. `fresh_layouts` empties the process-wide caches first, so the order
in the program is the order the fast tracer meets node types in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import inplace_doctor as ipd
from inplace_doctor.rules import FAST_MODE_RULES
from inplace_doctor.trace.fast import fast_writes, saved_fast

Program = Callable[[], list[torch.Tensor]]


@pytest.fixture
def fresh_layouts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The fast tracer's per-type caches empty for this test, and put back after it."""
    monkeypatch.setattr(saved_fast, "_layouts", {})
    monkeypatch.setattr(fast_writes, "_node_kinds", {})
    yield


def _line(site: Any) -> Any:
    if site is None:
        return None
    frame = site.stack[-1] if site.stack else None
    return frame.line if frame is not None else site.line


def _findings(program: Program, deep: bool, with_op: bool = True) -> list[tuple[Any, ...]]:
    torch.manual_seed(0)
    session = ipd.watch(deep=deep, select=sorted(FAST_MODE_RULES))
    with session:
        for out in program():
            try:
                out.sum().backward(retain_graph=True)
            except RuntimeError:  # the in-place error a finding confirms
                pass
    if not with_op:  # the node and field only (an in-place op's name: the strict xfail below)
        return sorted(((f.code, _line(f.mutation), _line(f.saved), f.slot, f.confirmed) for f in session.findings), key=repr)
    return sorted(
        (
            (f.code, _line(f.mutation), _line(f.saved), f.saved.op if f.saved else None, f.slot, f.confirmed, f.message)
            for f in session.findings
        ),
        key=repr,
    )


def _assert_same(program: Program, expected: int, with_op: bool = True) -> None:
    deep, fast = _findings(program, True, with_op), _findings(program, False, with_op)
    assert len(deep) == expected, deep
    assert fast == deep


# -- conditional saves: a node type met with all its fields saved, and with fewer ---------------

def _mul_all() -> list[torch.Tensor]:
    a, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    p, q = a * 1, b * 1
    y = p * q  # MulBackward0 saves `self` and `other`
    q.add_(1)
    return [y]


def _mul_fewer() -> list[torch.Tensor]:
    a, c = torch.randn(3, requires_grad=True), torch.randn(3)
    p, q = a * 2, c.clone()
    y = p * q  # only `p` needs grad: only `q` (`other`) is saved
    q.add_(1)
    r = c.clone()
    z = r * p  # only `other` needs grad: only `self` is saved
    r.mul_(3)
    return [y, z]


def _linear_all() -> list[torch.Tensor]:
    x, w, b = torch.randn(4, 3, requires_grad=True), torch.randn(5, 3, requires_grad=True), torch.randn(5)
    h, ww = x * 1, w * 1
    y = F.linear(h, ww, b)  # AddmmBackward0 saves mat1 and mat2
    h.add_(1)
    v = F.linear(x * 1, ww)  # MmBackward0, no bias
    ww.add_(1)
    return [y, v]


def _linear_fewer() -> list[torch.Tensor]:
    w, b = torch.randn(5, 3, requires_grad=True), torch.randn(5, requires_grad=True)
    xx = torch.randn(4, 3)
    y = F.linear(xx, w * 1, b)  # the input needs no grad: only mat1 (the input) is saved
    xx.add_(1)
    ww = w * 1
    z = torch.addmm(b, torch.randn(4, 3), ww.t())  # mat2 is not saved: its write is not a finding
    ww.add_(1)
    return [y, z]


def _layer_norm_all() -> list[torch.Tensor]:
    x, w = torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)
    wa, xa = w * 1, x * 1
    y = F.layer_norm(xa, (3,), wa, torch.zeros(3, requires_grad=True))
    wa.add_(1)
    xa.add_(1)
    return [y]


def _layer_norm_fewer() -> list[torch.Tensor]:
    x = torch.randn(4, 3, requires_grad=True)
    xa, xb = x * 1, x * 1
    y = F.layer_norm(xa, (3,))  # no weight, no bias
    xa.add_(1)
    z = F.layer_norm(xb, (3,), torch.ones(3), None)  # a weight that needs no grad
    xb.add_(1)
    return [y, z]


def _native_layer_norm_all() -> list[torch.Tensor]:
    x, w = torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)
    out, mean, _ = torch.native_layer_norm(x * 1, (3,), w * 1, torch.zeros(3, requires_grad=True), 1e-5)
    mean.add_(1)  # NativeLayerNormBackward0.result1
    return [out]


def _native_layer_norm_no_weight() -> list[torch.Tensor]:
    x = torch.randn(4, 3, requires_grad=True)
    out, _, rstd = torch.native_layer_norm(x * 1, (3,), None, torch.zeros(3, requires_grad=True), 1e-5)
    rstd.add_(1)  # a field after the one not saved (`weight`): result2, not result1
    return [out]


def _where_index_embedding() -> list[torch.Tensor]:
    x, y = torch.randn(4, 3, requires_grad=True), torch.randn(4, 3, requires_grad=True)
    cond = (x > 0).clone()
    h = torch.where(cond, x * 1, y * 1)
    cond.logical_not_()
    idx = torch.tensor([0, 2])
    g = torch.index_select(x * 1, 0, idx)
    idx.add_(1)
    ids = torch.tensor([1, 2, 3])
    e = F.embedding(ids, torch.randn(10, 3, requires_grad=True))
    ids.add_(1)
    return [h, g, e]


ALL_THEN_FEWER = [(_mul_all, 1), (_mul_fewer, 2), (_linear_all, 2), (_linear_fewer, 1),
                  (_layer_norm_all, 2), (_layer_norm_fewer, 2),
                  (_native_layer_norm_all, 1), (_native_layer_norm_no_weight, 1), (_where_index_embedding, 3)]


@pytest.mark.parametrize("order", ["all-first", "fewer-first"])
def test_conditional_saves_are_named_as_the_deep_tracer_names_them(fresh_layouts: None, order: str) -> None:
    """A node type met with all its fields saved and with fewer, in either order: deep's names."""
    programs = ALL_THEN_FEWER if order == "all-first" else ALL_THEN_FEWER[::-1]
    for program, expected in programs:
        _assert_same(program, expected)


def test_a_second_session_names_with_the_first_sessions_layouts(fresh_layouts: None) -> None:
    """The layouts one watch learnt (process-wide) name a later watch's nodes as deep does."""
    for program, expected in ALL_THEN_FEWER:
        _assert_same(program, expected)
    assert {"MulBackward0", "AddmmBackward0"} <= set(saved_fast._layouts)
    for program, expected in ALL_THEN_FEWER[::-1]:
        _assert_same(program, expected)


_OUT_OF_PLACE_AND_INPLACE: dict[str, tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]]] = {
    "div": (torch.div, torch.Tensor.div_),
    "addcmul": (torch.addcmul, torch.Tensor.addcmul_),
    "addcdiv": (torch.addcdiv, torch.Tensor.addcdiv_),
    "lerp": (torch.lerp, torch.Tensor.lerp_),
    "clamp": (torch.clamp, torch.Tensor.clamp_),
}


def _writes_to_operands(op: Callable[..., torch.Tensor]) -> Program:
    def program() -> list[torch.Tensor]:
        x = [torch.randn(3, requires_grad=True) for _ in range(3)]
        outs = []
        for _ in range(2):  # the second node named by the layout the first gave (when it has one)
            a, b, c = x[0] * 1, x[1] * 1, x[2] * 1
            outs.append(op(a, b) if op.__name__ in ("div", "div_") else op(a, b, c))  # a watch wraps Tensor.div_
        b.add_(1)
        c.mul_(2)
        return outs
    return program


@pytest.mark.parametrize("name", sorted(_OUT_OF_PLACE_AND_INPLACE))
@pytest.mark.parametrize("inplace_first", [False, True], ids=["out-of-place-first", "inplace-first"])
def test_an_inplace_variants_node_is_named_like_the_out_of_place_ones(
    fresh_layouts: None, name: str, inplace_first: bool,
) -> None:
    """One node type made by `op` and by `op_`, either met first: each saved operand's field as deep names it."""
    ops = _OUT_OF_PLACE_AND_INPLACE[name][::-1] if inplace_first else _OUT_OF_PLACE_AND_INPLACE[name]
    for op in ops:  # the layout one learns names the other's nodes
        _assert_same(_writes_to_operands(op), 1 if name == "div" else 2, with_op=False)


# -- saves no node-creation hook follows, then a node of a known layout --------------------------

def _after_checkpoint() -> list[torch.Tensor]:
    x, w = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    t = (x * 1) * (w * 1)  # MulBackward0's layout learnt
    a, b = x * 1, w * 1
    # saves `a` and `b` with the tracer's hooks, and no hook follows until the region's `u * v`,
    # a MulBackward0 holding the checkpoint's own packs: as many records as its layout has
    y = checkpoint(lambda u, v: u * v, a, b, use_reentrant=False)
    p, c = x * 1, torch.randn(3)
    r = p * c
    c.add_(1)
    a.add_(1)
    return [t, y, r]


def _checkpoint_making_no_node() -> list[torch.Tensor]:
    x, w = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    t = (x * 1) * (w * 1)
    a, b = x * 1, w * 1
    y = checkpoint(lambda u, v: (u[:2], v.view(3)), a, b, use_reentrant=False)  # views only: the next hook is `p * q`'s
    p, q = x * 1, w * 1
    r = p * q
    q.add_(1)
    a.add_(1)
    return [r, y[0], t]


def _after_users_hooks() -> list[torch.Tensor]:
    x, w = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    u, v = x * 1, w * 1
    t = u * v
    with torch.autograd.graph.saved_tensors_hooks(lambda s: s, lambda s: s):
        s = u * v  # the program's hooks pack these, not the tracer's
    p, q = x * 1, w * 1
    r = p * q
    p.add_(1)
    u.add_(1)
    return [t, s, r]


def _after_save_on_cpu() -> list[torch.Tensor]:
    x, w = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    u, v = x * 1, w * 1
    t = u * v
    with torch.autograd.graph.save_on_cpu():
        s = u * v
        e = u.exp()
    p, q = x * 1, w * 1
    r = p * q
    q.add_(1)
    u.add_(1)
    return [t, s, e, r]


@pytest.mark.parametrize(
    ("program", "expected"), [(_after_checkpoint, 2), (_after_users_hooks, 2), (_after_save_on_cpu, 2)],
    ids=["checkpoint", "users-hooks", "save-on-cpu"],
)
def test_saves_no_hook_follows_do_not_shift_the_next_nodes_names(
    fresh_layouts: None, program: Program, expected: int,
) -> None:
    """Saves packed elsewhere or followed by no node hook, then a node of a known layout: deep's names."""
    _assert_same(program, expected)
    _assert_same(program, expected)  # and again, every layout known


# -- custom Functions, per-call node types, double backward, vmap, an op that raised -------------

class _SavesTwice(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b, a, None)
        return a * b

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b, _, _ = ctx.saved_tensors
        return g * b, g * a


class _DirtyMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a.mul_(b)
        ctx.mark_dirty(a)
        ctx.save_for_backward(a, b)
        return a

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        return g * b, g * a


class _InnerGraph(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():  # nodes made, and tensors saved, before this node's own saves
            ctx.inner = a.detach().requires_grad_() * b
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        return g * b, g * a


# `ctx.inner`'s graph (MulBackward0 saved h, which `h.add_(1)` overwrites) is never backpropagated
# and is freed with the outputs inside the session: no finding. (A cache keyed by the Function's
# class once kept it alive past the session, where it was reported unconfirmed.)
def _custom_functions() -> list[torch.Tensor]:
    x, w = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    a, b = x * 1, w * 1
    y = _SavesTwice.apply(a, b)
    b.add_(1)
    c, d = x * 1, w * 1
    y2 = _SavesTwice.apply(c, d)
    c.add_(1)  # saved twice: saved_tensors[0] and [2]
    e, f = x * 1, w * 1
    z = _DirtyMul.apply(e, f)
    f.add_(1)
    z.add_(1)
    g, h = x * 1, w * 1
    v = _InnerGraph.apply(g, h)
    h.add_(1)
    return [y, y2, z, v]


def _batch_norm_per_call() -> list[torch.Tensor]:
    # one module per call: a running stat saved by several nodes is named after one of them, and
    # which one the deep tracer names varies from run to run (reported, not what this test checks)
    train, evaluated, again = torch.nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3).eval(), torch.nn.BatchNorm1d(3)
    mean, var = evaluated.running_mean, again.running_var
    assert mean is not None and var is not None
    x = torch.randn(4, 3, requires_grad=True)
    a = x * 1
    y = train(a)
    a.add_(1)
    b = x * 1
    y2 = evaluated(b)  # eval: the running stats are saved and read
    b.add_(1)
    mean.add_(1)
    c = x * 1
    y3 = again(c)  # training: saved, and updated in place by the forward
    var.add_(1)
    c.add_(1)
    return [y, y2, y3]


def _batch_norm_data_writes() -> list[torch.Tensor]:
    bn = torch.nn.BatchNorm1d(3)
    mean, var = bn.running_mean, bn.running_var
    assert mean is not None and var is not None
    x = torch.randn(4, 3, requires_grad=True)
    y1, y2 = bn(x * 1), bn(x * 1)  # training: the running stats saved, never read by backward
    mean.data.add_(1)  # no version bump: a finding only where backward reads the field
    bn.eval()
    y3 = bn(x * 1)  # eval: they are read
    var.data.mul_(2)
    return [y1, y2, y3]


def _list_fields() -> list[torch.Tensor]:
    x = torch.randn(5, 3, requires_grad=True)
    idx = torch.tensor([0, 2])
    y = (x * 1)[idx]  # IndexBackward0.indices[0]
    idx.add_(1)
    rows, cols = torch.tensor([1, 3]), torch.tensor([0, 1])
    z = (x * 1)[rows, cols]
    cols.add_(1)  # indices[1]
    w = (x * 1).index_put((rows, cols), torch.randn(2, requires_grad=True) * 1)
    rows.mul_(2)
    return [y, z, w]


def _raised_mid_op() -> list[torch.Tensor]:
    x, w = torch.randn(3, requires_grad=True), torch.randn(4, requires_grad=True)
    try:
        (x * 1) * (w * 1)  # saves both operands, then raises before its node exists
    except RuntimeError:
        pass
    p, q = x * 1, x * 1
    r = p * q
    p.add_(1)
    with contextlib.suppress(RuntimeError):
        torch.addmm(x.view(1, 3) * 1, x.view(1, 3) * 1, w.view(1, 4) * 1)
    k = x.exp()
    k.add_(1)
    return [r, k]


def _raised_with_a_hand_out() -> list[torch.Tensor]:
    x, w = torch.randn(3, requires_grad=True), torch.randn(4, requires_grad=True)
    a = x * 1
    shared = a.detach().numpy()  # content checks on: records on `a`'s memory are fingerprinted
    with contextlib.suppress(RuntimeError):
        a * (w * 1)
    p = a * 1
    r = p * a
    shared += 1
    p.add_(1)
    return [r]


def _double_backward() -> list[torch.Tensor]:
    x = torch.randn(3, requires_grad=True)
    y = (x * x).sin()
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)  # backward's saves, in backward
    h = g * x
    g.add_(1)
    z = g.exp()
    z.mul_(2)
    return [h, z]


def _vmapped() -> list[torch.Tensor]:
    x, w = torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)
    y = torch.vmap(lambda r: (r * w).sin())(x * 1)
    v = (x * 1).exp()
    v.add_(1)
    p, q = x * 1, w * 1
    s = p * q
    q.add_(1)
    return [y, v, s]


@pytest.mark.parametrize(
    ("program", "expected"),
    [(_custom_functions, 6), (_batch_norm_data_writes, 1), (_list_fields, 3),
     (_raised_mid_op, 2), (_raised_with_a_hand_out, 2), (_double_backward, 2), (_vmapped, 2)],
    ids=["custom-functions", "batch-norm-data", "list-fields", "raised-mid-op", "raised-hand-out",
         "double-backward", "vmap"],
)
def test_special_nodes_are_named_as_the_deep_tracer_names_them(
    fresh_layouts: None, program: Program, expected: int,
) -> None:
    """Custom Functions, BatchNorm, an op that raised, backward's own saves, vmap: deep's names."""
    _assert_same(program, expected)
    _assert_same(program, expected)


def test_batch_norm_per_call_saves_are_all_found_and_named_as_the_deep_tracer_names_them(fresh_layouts: None) -> None:
    """Per-call BatchNorm nodes: the fast tracer finds all five writes, each named as the deep tracer names it."""
    # Both once missed the eval-mode running_mean's finding when the garbage collector freed the
    # graph inside the session after backward raised at that node's input (test_stopped_backward.py).
    for _ in range(2):
        deep = _findings(_batch_norm_per_call, True, True)
        fast = _findings(_batch_norm_per_call, False, True)
        assert len(fast) == len(deep) == 5 and set(deep) <= set(fast), (fast, deep)


# -- differences: the op the fast tracer infers from the node's name ------------------------------

def _inplace_ops() -> list[torch.Tensor]:
    x, w = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    y = F.relu(x * 1, inplace=True)  # ReluBackward0.result, saved by `relu_`
    y.add_(1)
    z, v = x * 1, w * 1
    z.mul_(v)  # MulBackward0.other, saved by `mul_`
    v.add_(1)
    return [y, z]


def test_an_inplace_ops_saves_are_named_by_the_inplace_op(fresh_layouts: None) -> None:
    """`F.relu(x, inplace=True)`'s saved result is saved by `relu_`, in fast mode as in deep."""
    _assert_same(_inplace_ops, 2)


def _ops_not_named_like_their_node() -> list[torch.Tensor]:
    x = torch.randn(2, 4, 6, 6, requires_grad=True)
    a, b, c, d = x * 1, x * 1, x * 1, x * 1
    outs = [F.max_pool2d(a, 2), F.avg_pool2d(b, 2), torch.cdist(c, c), F.logsigmoid(d)]
    a.add_(1)
    b.add_(1)
    c.add_(1)
    d.add_(1)
    logits, target = torch.randn(4, 5, requires_grad=True), torch.tensor([0, 1, 2, 3])
    outs.append(F.cross_entropy(logits * 1, target))  # NllLossBackward0, made by nll_loss_forward
    target.add_(1)
    ids, offsets = torch.tensor([1, 2, 4, 5]), torch.tensor([0, 2])
    outs.append(F.embedding_bag(ids, torch.randn(10, 3, requires_grad=True), offsets))  # by _embedding_bag
    ids.add_(1)
    return outs


def test_saves_of_ops_not_named_like_their_node_name_the_op_that_made_it(fresh_layouts: None) -> None:
    """Pooling, cdist, logsigmoid, cross-entropy and embedding_bag's saves name the op deep names."""
    _assert_same(_ops_not_named_like_their_node, 6)
