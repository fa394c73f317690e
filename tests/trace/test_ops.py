"""Op facts read from ATen schemas: which ops write, which argument, metadata-only writes, and the
foreach version bump the tracer restores."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from inplace_doctor.trace.ops import op_facts, op_name, restores_version_bump, write_spec, writes_bytes, written_tensors

aten = torch.ops.aten


# --- write_spec -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "op",
    [aten.relu_.default, aten.add_.Tensor, aten.mul_.Scalar, aten.copy_.default, aten.index_put_.default],
    ids=str,
)
def test_in_place_ops_write_self(op):
    assert write_spec(op) == (("self", 0),)


def test_out_variant_writes_its_out_argument():
    # add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out): keyword-only, position 3
    assert write_spec(aten.add.out) == (("out", 3),)


def test_foreach_in_place_writes_its_list():
    assert write_spec(aten._foreach_add_.List) == (("self", 0),)
    assert write_spec(aten._foreach_add_.Scalar) == (("self", 0),)
    assert write_spec(aten._foreach_add.List) == ()


@pytest.mark.parametrize(
    "op",
    [aten.relu.default, aten.add.Tensor, aten.sigmoid.default, aten.view.default, aten.t.default],
    ids=str,
)
def test_functional_and_view_ops_write_nothing(op):
    # views alias their input (Tensor(a)) but do not write it (no `!`)
    assert write_spec(op) == ()


def test_batch_norm_running_stats_are_not_in_its_schema():
    # native_batch_norm updates running_mean/var but its schema does not mark them: op_facts flags it instead
    assert write_spec(aten.native_batch_norm.default) == ()
    assert op_facts(aten.native_batch_norm.default)[2] is True


def test_write_spec_is_cached_per_overload():
    assert write_spec(aten.relu_.default) is write_spec(aten.relu_.default)


# --- op_facts -------------------------------------------------------------------------------------


def test_op_facts():
    assert op_facts(aten.relu_.default) == (aten.relu_.default, (("self", 0),), False)
    assert op_facts(aten.relu.default) == (aten.relu.default, (), False)
    assert op_facts(aten._native_batch_norm_legit.default)[2] is True
    assert op_facts(aten.add_.Tensor) is op_facts(aten.add_.Tensor)


# --- op_name and writes_bytes --------------------------------------------------------------------


def test_op_name_drops_the_overload():
    assert op_name(aten.relu_.default) == "aten.relu_"
    assert op_name(aten.add_.Tensor) == "aten.add_"
    assert op_name(aten.add.out) == "aten.add"
    assert op_name(aten._foreach_add_.List) == "aten._foreach_add_"


@pytest.mark.parametrize(
    "op", [aten.relu_.default, aten.add_.Tensor, aten.copy_.default, aten.index_put_.default, aten.zero_.default], ids=str
)
def test_value_writes_write_bytes(op):
    assert writes_bytes(op)


@pytest.mark.parametrize(
    "op",
    [aten.squeeze_.default, aten.unsqueeze_.default, aten.t_.default, aten.transpose_.default,
     aten.set_.source_Tensor, aten.resize_.default, aten.detach_.default, aten.as_strided_.default],
    ids=str,
)
def test_metadata_only_ops_write_no_bytes(op):
    assert write_spec(op) == (("self", 0),)  # still a write: the version counter moves
    assert not writes_bytes(op)


def test_metadata_only_ops_really_keep_the_values_and_bump_the_version():
    t = torch.arange(4.0).reshape(1, 4)
    before = t.clone()
    t.squeeze_()
    assert t._version == 1 and torch.equal(t, before.squeeze(0))


# --- written_tensors ------------------------------------------------------------------------------


def test_written_tensors_positional_and_keyword():
    a, b = torch.zeros(2), torch.ones(2)
    assert [id(t) for t in written_tensors(write_spec(aten.add_.Tensor), (a, b), {})] == [id(a)]
    out = torch.empty(2)
    got = written_tensors(write_spec(aten.add.out), (a, b), {"out": out})
    assert len(got) == 1 and got[0] is out


def test_written_tensors_of_a_foreach_list():
    ts = [torch.zeros(1), torch.zeros(2)]
    got = written_tensors(write_spec(aten._foreach_add_.List), (ts, ts), {})
    assert [id(t) for t in got] == [id(t) for t in ts]


def test_written_tensors_of_a_non_writing_op():
    assert written_tensors(write_spec(aten.add.Tensor), (torch.zeros(1), torch.zeros(1)), {}) == []


def test_written_tensors_as_the_dispatcher_calls_them():
    """The args and kwargs a dispatch mode receives for `x.relu_()`, `torch.add(a, b, out=o)` and a foreach step."""
    calls: list[tuple[Any, Any, Any]] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls.append((func, args, kwargs or {}))
            return func(*args, **(kwargs or {}))

    x, a, b, o = torch.randn(3), torch.randn(3), torch.randn(3), torch.empty(3)
    params = [torch.zeros(2), torch.zeros(3)]
    with Record():
        x.relu_()
        torch.add(a, b, out=o)
        torch._foreach_add_(params, 1.0)
    written = {op_name(func): written_tensors(write_spec(func), args, kwargs) for func, args, kwargs in calls}
    assert [id(t) for t in written["aten.relu_"]] == [id(x)]
    assert [id(t) for t in written["aten.add"]] == [id(o)]
    assert [id(t) for t in written["aten._foreach_add_"]] == [id(p) for p in params]


# --- restores_version_bump ------------------------------------------------------------------------


def foreach_bump_lost_under_a_mode() -> bool:
    """Plain PyTorch bumps `_foreach_*_` outputs; under a Python dispatch mode, does this torch?"""

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    t = torch.zeros(2)
    with torch.no_grad(), Passthrough():
        torch._foreach_add_([t], 1.0)
    return t._version == 0


def test_plain_foreach_bumps_the_version():
    t = torch.zeros(2)
    with torch.no_grad():
        torch._foreach_add_([t], 1.0)
    assert t._version == 1


def test_foreach_in_place_ops_restore_the_bump_exactly_when_a_mode_loses_it():
    lost = foreach_bump_lost_under_a_mode()
    assert restores_version_bump(aten._foreach_add_.List) is lost
    assert restores_version_bump(aten._foreach_mul_.Scalar) is lost


@pytest.mark.parametrize(
    "op",
    [aten.relu_.default, aten.add_.Tensor, aten.copy_.default, aten._foreach_add.List, aten.relu.default],
    ids=str,
)
def test_other_ops_need_no_restored_bump(op):
    # ordinary in-place ops bump their own version under a mode; functional foreach ops write nothing
    assert restores_version_bump(op) is False


def test_ordinary_in_place_ops_keep_their_bump_under_a_mode():
    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    t = torch.zeros(2)
    with torch.no_grad(), Passthrough():
        t.add_(1.0)
    assert t._version == 1
