"""Facts the fast tracer stands on (issue 26): writes seen by Python kernels at `ADInplaceOrView`.

Each test runs a real program twice where it matters, with and without the
kernels, and checks that PyTorch behaves the same (values, version counters,
its own errors) while every write reaches the recorder. Costs are measured by
`benchmarks/fast_spike.py`, not here.
"""

from __future__ import annotations

import re
import sys
import threading
import warnings

import pytest
import torch
from torch import nn

from inplace_doctor._compat import gather_traceback, symbolize_tracebacks
from inplace_doctor.trace.fast.write_kernels import WriteKernels, end_linger, mutating_overloads, registered

aten = torch.ops.aten


class Recorded:
    """The recorder: (op name, shapes written) per write."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, list[tuple[int, ...]]]] = []

    def __call__(self, op, written):
        self.writes.append((str(op), [tuple(t.shape) for t in written]))

    def ops(self) -> list[str]:
        return [name for name, _ in self.writes]


def watched(program):
    recorded = Recorded()
    with WriteKernels(recorded):
        result = program()
    return recorded, result


def _stale_saved_tensor():
    x = torch.randn(4, 4, requires_grad=True)
    h = torch.sigmoid(x)
    h.mul_(2)  # sigmoid saved its output
    h.sum().backward()


def test_pytorch_still_raises_its_own_error_at_backward_and_the_write_is_seen():
    recorded = Recorded()
    with WriteKernels(recorded), pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _stale_saved_tensor()
    assert recorded.ops() == ["aten.mul_.Tensor"]  # `mul_(2)`: a wrapped number in a Tensor slot


def test_registration_is_undone_when_the_linger_ends_and_pytorch_bumps_versions_again():
    with WriteKernels(Recorded()):
        assert registered() > 1000
    end_linger()
    assert registered() == 0
    t = torch.zeros(3)
    t.add_(1)
    assert t._version == 1  # PyTorch's own ADInplaceOrView kernel is back
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _stale_saved_tensor()


def test_enumeration_covers_the_writes_users_make_and_leaves_view_ops_alone():
    names = {str(op) for op, _, _ in mutating_overloads()}
    for wanted in (
        "aten.add_.Tensor", "aten.add.out", "aten.copy_.default", "aten.index_put_.default",
        "aten.set_.source_Tensor", "aten._foreach_add_.List", "aten._fused_adam_.default",
        "aten.bernoulli_.float", "aten.relu_.default",
    ):
        assert wanted in names
    for view in ("aten.view.default", "aten.transpose.int", "aten.transpose_.default", "aten.as_strided_.default"):
        assert view not in names
    # ops without an ADInplaceOrView kernel of their own (they bump elsewhere): recorded, not bumped
    own = {str(op): has for op, _, has in mutating_overloads()}
    assert own["aten.add_.Tensor"] and not own["aten._foreach_add_.List"] and not own["aten._fused_adam_.default"]


def _writes_of_every_kind():
    y = torch.randn(3)
    y.data.mul_(2)
    with torch.no_grad():
        y.add_(1)
    out = torch.empty(3)
    torch.add(y, y, out=out)
    y[y > 0] = 0
    y.copy_(torch.ones(3))
    z = torch.zeros(2)
    z.set_(torch.zeros(5))
    ts = [torch.zeros(2), torch.zeros(3)]
    torch._foreach_add_(ts, 1.0)
    return [y, out, z, *ts]


def test_data_no_grad_out_index_put_copy_set_and_foreach_writes_are_seen_once_each():
    recorded, watched_tensors = watched(_writes_of_every_kind)
    assert recorded.ops() == [
        "aten.mul_.Tensor",  # through .data
        "aten.add_.Tensor",  # under no_grad
        "aten.add.out",
        "aten.index_put_.default",  # not also the _index_put_impl_ it calls
        "aten.copy_.default",
        "aten.set_.source_Tensor",
        "aten._foreach_add_.Scalar",
    ]
    plain = _writes_of_every_kind()
    assert [t._version for t in watched_tensors] == [t._version for t in plain]


def _written_but_not_returned():
    h = torch.randn(4, 8, requires_grad=True) * 1
    y = torch.nn.functional.rrelu(h, training=True, inplace=True)  # rrelu_with_noise_ writes its noise too
    bn = nn.BatchNorm1d(8)
    bn(torch.randn(4, 8))  # running statistics written, outputs returned
    return [h, y.grad_fn._saved_noise, bn.running_mean, bn.running_var]


def test_a_tensor_an_op_writes_without_returning_it_keeps_its_version_as_in_plain_pytorch():
    # PyTorch's kernels bump the versions of what they return only: bumping F.rrelu's noise made
    # the tool's own check at unpack raise in a program that runs (`watch()` on nn.RReLU(inplace=True)).
    recorded, watched_tensors = watched(_written_but_not_returned)
    assert "aten.rrelu_with_noise_.default" in recorded.ops()
    assert [t._version for t in watched_tensors] == [t._version for t in _written_but_not_returned()]


@pytest.mark.parametrize("kind", ["foreach", "fused", "for-loop"])
def test_optimizer_steps_are_seen_and_versions_match_plain(kind):
    def step():
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        options = {"foreach": {"foreach": True}, "fused": {"fused": True}, "for-loop": {"foreach": False}}[kind]
        opt = torch.optim.Adam(model.parameters(), **options)
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        return [p.detach().clone() for p in model.parameters()], [p._version for p in model.parameters()]

    recorded, (values, versions) = watched(step)
    plain_values, plain_versions = step()
    assert versions == plain_versions
    assert all(torch.equal(a, b) for a, b in zip(values, plain_values))
    expected = {"foreach": "aten._foreach_", "fused": "aten._fused_adam_", "for-loop": "aten.addcdiv_"}[kind]
    assert any(op.startswith(expected) for op in recorded.ops()), recorded.ops()


def test_view_ops_keep_their_kernels_writes_through_views_bump_the_base():
    def program():
        x = torch.randn(3, 4, requires_grad=True)
        h = torch.sigmoid(x)
        v = h.transpose(0, 1)[1]
        v.zero_()  # a write through a view of the saved output
        t = torch.randn(3, 4)
        t.t_()  # an in-place view op: PyTorch's own kernel
        return h, v, t

    recorded, (h, v, t) = watched(program)
    assert v._base is h and h._version == 1 and t.shape == (4, 3)
    assert recorded.ops() == ["aten.zero_.default"]
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        h.sum().backward()


def test_scalar_arguments_keep_their_type_promotion():
    """`x.mul_(2.5)` passes a wrapped number; the kernel must not turn it into a 0-dim tensor of
    another dtype (a 0-dim float16 times a 0-dim float64 computes in float64)."""

    def program():
        half = torch.tensor(1.3, dtype=torch.float16)
        half.mul_(2.7)
        integer = torch.tensor([5])
        integer.add_(True)
        return half, integer

    _, (half, integer) = watched(program)
    plain_half, plain_integer = program()
    assert half.dtype == torch.float16 and torch.equal(half, plain_half) and torch.equal(integer, plain_integer)
    with pytest.raises(RuntimeError, match="can't be cast"), WriteKernels(Recorded()):
        torch.tensor([5]).mul_(2.5)  # PyTorch's own error, as without the kernels


def test_a_training_step_is_bit_identical_with_and_without_the_kernels():
    def step():
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.Dropout(0.2), nn.Flatten(), nn.LazyLinear(2)
        )
        x = torch.randn(2, 3, 8, 8)
        y = model(x)
        y.sum().backward()
        return [y.detach()] + [p.grad for p in model.parameters()] + [b.clone() for b in model.buffers()]

    recorded, with_kernels = watched(step)
    plain = step()
    assert all(torch.equal(a, b) for a, b in zip(with_kernels, plain))
    assert "aten.relu_.default" in recorded.ops()


def test_threads_started_inside_are_not_recorded():
    recorded = Recorded()
    with WriteKernels(recorded):
        worker = threading.Thread(target=lambda: torch.zeros(2).add_(1))
        worker.start()
        worker.join()
        torch.zeros(2).sub_(1)
    assert recorded.ops() == ["aten.sub_.Tensor"]


def test_nested_entries_share_one_registration():
    outer, inner = Recorded(), Recorded()
    with WriteKernels(outer):
        count = registered()
        with WriteKernels(inner):
            assert registered() == count
            torch.zeros(1).add_(1)
        torch.zeros(1).mul_(2)
        assert registered() == count
    end_linger()
    assert registered() == 0
    # a write inside the inner context reaches both, as two stacked dispatch modes both see an op
    assert inner.ops() == ["aten.add_.Tensor"] and outer.ops() == ["aten.add_.Tensor", "aten.mul_.Tensor"]


def test_registering_over_pytorch_kernels_warns_nothing_on_this_torch():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with WriteKernels(Recorded()):
            pass
    assert [str(w.message) for w in caught] == []


def test_a_pack_hook_stack_captured_in_c_resolves_to_the_saving_line():
    stacks = []

    def pack(t):
        stacks.append(gather_traceback(True, False, False))
        return t.detach()

    x = torch.randn(3, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        line = sys._getframe().f_lineno + 1
        y = torch.sigmoid(x)
    assert y.grad_fn is not None and len(stacks) == 1
    frames = symbolize_tracebacks(stacks)[0]
    assert any(f["filename"] == __file__ and f["line"] == line for f in frames), frames
    assert re.search(r"test_write_kernels", frames[0]["filename"] + frames[-1]["filename"])


def test_torch_compile_does_not_trace_into_the_kernels_but_its_tracing_writes_reach_them():
    """Dynamo compiles the program without a graph break, but while it traces, the kernels see the
    writes of fake and functional tensors: the fast tracer runs compiled code eagerly (as `watch`
    does) or ignores those tensor types."""
    torch._dynamo.reset()
    seen = []

    @torch.compile(backend="aot_eager")
    def program(x):
        y = x * 2
        y.add_(1)
        return y.sin()

    with WriteKernels(lambda op, written: seen.append(type(written[0]).__name__)):
        x = torch.randn(3, requires_grad=True)
        out = program(x)
    torch._dynamo.reset()
    assert torch.equal(out, (x.detach() * 2 + 1).sin())
    assert "FakeTensor" in seen and "FunctionalTensor" in seen
