"""The fast tracer's saved tensors: placed and named in the node-creation hook, by pack order
for a node type whose fields it has seen all saved (`trace/fast/saved_fast.py`), exactly as read from
the node's fields."""

from __future__ import annotations

import contextlib

import torch

import inplace_doctor as ipd
from inplace_doctor.rules import FAST_MODE_RULES
from inplace_doctor.trace.fast.saved_fast import _layouts
from inplace_doctor.trace.places.nodes import origin_of, saved_attrs
from inplace_doctor.trace.saves.saved import SavedRecord


def _fields_of(node: object) -> dict[int, str]:
    """id(record) -> the field of `node` that holds it, read from the node."""
    held = {}
    for attr, field in saved_attrs(node):
        raw = getattr(node, attr)
        for i, saved in enumerate(raw if isinstance(raw, (tuple, list)) else (raw,)):
            if type(saved.data) is SavedRecord:
                held[id(saved.data)] = f"{field}[{i}]" if isinstance(raw, (tuple, list)) else field
    return held


def _named(node: object) -> dict[int, tuple[str | None, str | None]]:
    out = {}
    for attr, _ in saved_attrs(node):
        raw = getattr(node, attr)
        for saved in raw if isinstance(raw, (tuple, list)) else (raw,):
            record = saved.data
            if type(record) is SavedRecord:
                out[id(record)] = (record.node, record.field)
    return out


def test_nodes_named_by_pack_order_hold_the_fields_read_from_them() -> None:
    """Mul saves `self` only when `other` needs grad and `other` only when `self` does: a node of
    a type whose layout is known but that saved fewer tensors is named from its fields."""
    x = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(4, 3, requires_grad=True)
    with ipd.watch(deep=False, select=sorted(FAST_MODE_RULES)):
        outs = [x * w, x * w, x * w.detach(), x.detach() * w, torch.addmm(x[:, :1], x, w.t()), x.exp()]
        outs += [torch.addmm(x[:, :1], x, w.t()), x.exp(), x.sigmoid() * w]
        y = x * 1
        outs.append(y.mul_(w))  # the clone of `self` makes a CloneBackward0 between Mul's two saves
        nodes = [out.grad_fn for out in outs]
        for node in nodes:
            held = _fields_of(node)
            assert held, node.name()
            assert _named(node) == {key: (node.name(), field) for key, field in held.items()}
    assert "MulBackward0" in _layouts and "AddmmBackward0" in _layouts


def test_a_record_is_saved_where_its_node_was_made() -> None:
    """A node that saves records is placed by them: its origin is the stack its saves captured."""
    x = torch.randn(3, requires_grad=True)
    with ipd.watch(deep=False, select=sorted(FAST_MODE_RULES)) as session:
        y = x.sigmoid()
        z = y * x
        for out in (y, z):
            created = origin_of(out.grad_fn)
            records = session.tracer.saved_records(x.untyped_storage().data_ptr())
            assert created is not None and records
        [for_z] = [r for r in records if r.node == "MulBackward0"]
        assert origin_of(z.grad_fn).stack is for_z.stack  # type: ignore[union-attr]


def test_a_save_of_an_op_that_raised_is_not_named_for_the_next_node() -> None:
    """`x * v` with mismatched shapes saves both operands, then raises before its node exists:
    those records die with the op, and the next node's packs are its own."""
    x = torch.randn(4, 3, requires_grad=True)
    v = torch.randn(5, requires_grad=True)
    with ipd.watch(deep=False, select=sorted(FAST_MODE_RULES)) as session:
        with contextlib.suppress(RuntimeError):
            x * v
        y = x.exp()
        [record] = session.tracer.saved_records(y.untyped_storage().data_ptr())
        assert (record.node, record.field, record.op) == ("ExpBackward0", "result", "aten.exp")
        assert session.tracer.live_saved_tensors() == 1
