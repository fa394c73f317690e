"""Kernels that write an argument their node saved before the kernel ran (trace/checkpoint/saved_writes.py).

The class is found from every aten schema, and each member's saves are probed with real calls:
which tensors autograd packs before the kernel runs and which after. Then the detection under
non-reentrant checkpoint (IPD111, cause saved-before-write) on `F.rrelu`, `nn.RReLU` and the op
itself, checked against the gradients plain PyTorch computes, and the cases where nothing is wrong
and nothing may be said.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

import inplace_doctor as ipd
from inplace_doctor.causes import RecomputeCause
from inplace_doctor.rules import FAST_MODE_RULES
from inplace_doctor.trace.checkpoint.saved_writes import SAVED_THEN_WRITTEN

RRELU = torch.ops.aten.rrelu_with_noise

# Every differentiable-looking op that writes a tensor argument it does not return, and why it is
# (or is not) in SAVED_THEN_WRITTEN; `.out` overloads are left out (out= variants have no autograd).
CANDIDATES = {
    "rrelu_with_noise.default": "in the class",
    "rrelu_with_noise_.default": "saves its result, after the kernel",
    "_batch_norm_with_update.default": "saves its outputs, after the kernel",
    "_native_batch_norm_legit.default": "saves its outputs, after the kernel",
    "_fused_moving_avg_obs_fq_helper.default": "saves none of what it writes",
    "_amp_foreach_non_finite_check_and_unscale_.default": "no autograd formula (the scaler's flag)",
    "_flash_attention_forward_no_dropout_inplace.default": "no autograd formula (writes `out`)",
    "_cummax_helper.default": "saves nothing (probed: no pack, no node); `cummax` saves `self` before and its indices after",
    "_cummin_helper.default": "saves nothing (probed: no pack, no node); `cummin` saves `self` before and its indices after",
    "fused_moving_avg_obs_fake_quant.default": "composite over `_fused_moving_avg_obs_fq_helper`, which saves none of what it writes",
    "_amp_update_scale_.default": "no autograd formula (the scaler's growth tracker and scale)",
    "record_stream.default": "writes no values: the write marker records the tensor's use on a stream",
    "retain_grad.default": "writes no values: marks the tensor to keep its `.grad`",
    "set_data.default": "the `.data =` setter: swaps the tensor's data, no autograd formula",
}


def _written_not_returned() -> set[str]:
    """Every registered aten schema, not `dir(torch.ops.aten)`: that lists only the packets
    resolved so far in this process, so it depended on which tests ran before."""
    found = set()
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::"):
            continue
        name, overload = schema.name.removeprefix("aten::"), schema.overload_name or "default"
        if not schema.is_mutable or overload.startswith("out"):
            continue
        returned = {a for r in schema.returns if r.alias_info is not None for a in r.alias_info.before_set}
        for arg in schema.arguments:
            info = arg.alias_info
            if (
                info is not None
                and info.is_write
                and str(arg.type) in ("Tensor", "Optional[Tensor]")
                and not arg.kwarg_only
                and not set(info.before_set) & returned
            ):
                found.add(f"{name}.{overload}")
    return found


def test_the_class_is_read_from_every_aten_schema() -> None:
    assert _written_not_returned() == set(CANDIDATES)
    members = {f"{name.removeprefix('aten.')}.default" for name in SAVED_THEN_WRITTEN}
    assert members == {op for op, why in CANDIDATES.items() if why == "in the class"}


def _saves(op: Any, call: Callable[[], Any], written: torch.Tensor) -> tuple[list[bool], list[bool]]:
    """For a real call of `op`: (which pre-kernel saves are `written`'s memory, which post-kernel ones are)."""
    seen: dict[str, list[bool]] = {"before": [], "after": []}
    state = {"phase": "before"}

    class Kernel(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if func is op:
                state["phase"] = "after"
            return out

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[state["phase"]].append(t.untyped_storage().data_ptr() == written.untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), Kernel():
        call()
    return seen["before"], seen["after"]


def test_rrelu_with_noise_saves_its_noise_before_the_kernel_and_nothing_after() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    noise = torch.empty(3, 4)
    before, after = _saves(RRELU.default, lambda: RRELU(x * 1.0, noise, 0.1, 0.3, True), noise)
    assert any(before) and after == []


def test_the_in_place_rrelu_and_batch_norm_save_after_the_kernel_too() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    noise = torch.empty(3, 4)
    y = x * 1.0
    before, after = _saves(torch.ops.aten.rrelu_with_noise_.default, lambda: torch.ops.aten.rrelu_with_noise_(y, noise, 0.1, 0.3, True), noise)
    assert any(before) and after  # its result: the recompute runs the kernel
    x4 = torch.randn(2, 3, 4, 4, requires_grad=True)
    w, b = torch.ones(3, requires_grad=True), torch.zeros(3, requires_grad=True)
    rm, rv = torch.zeros(3), torch.ones(3)
    legit = torch.ops.aten._native_batch_norm_legit
    before, after = _saves(legit.default, lambda: legit(x4, w, b, rm, rv, True, 0.1, 1e-5), rm)
    assert any(before) and after
    with_update = torch.ops.aten._batch_norm_with_update
    before, after = _saves(with_update.default, lambda: with_update(x4, w, b, rm, rv, 0.1, 1e-5), rm)
    assert any(before) and after


# -- the detection under checkpoint ----------------------------------------------------------------


#: each check under both tracers: the fast one runs per op inside checkpoint regions (issue 26)
MODES = pytest.mark.parametrize("deep", [True, False], ids=["deep", "fast"])


def _watch(fn: Callable[[], None], deep: bool = True, **options: Any) -> list[ipd.Finding]:
    if not deep:
        options.setdefault("select", sorted(FAST_MODE_RULES))
    session = ipd.watch(deep=deep, **options)
    with session:
        fn()
    assert session.deep is deep
    return [f for f in session.report().findings if f.severity is not ipd.Severity.INFO]


def _rrelu(t: torch.Tensor) -> torch.Tensor:
    return F.rrelu(t * 1.0, training=True)


@MODES
def test_f_rrelu_under_checkpoint_is_reported_and_its_gradient_is_wrong(deep: bool) -> None:
    x = torch.randn(4, 5, requires_grad=True)
    torch.manual_seed(3)
    plain = torch.autograd.grad(_rrelu(x).sum(), x)[0]
    torch.manual_seed(3)
    assert not torch.equal(torch.autograd.grad(checkpoint(_rrelu, x, use_reentrant=False).sum(), x)[0], plain)

    findings = _watch(lambda: checkpoint(_rrelu, x, use_reentrant=False).sum().backward(), deep)
    [finding] = findings
    assert (finding.code, finding.cause, finding.severity) == ("IPD111", RecomputeCause.SAVED_BEFORE_WRITE, ipd.Severity.ERROR)
    assert finding.mutation.line == _rrelu.__code__.co_firstlineno + 1
    assert finding.saved is not None and finding.saved.line == finding.mutation.line
    assert "writes its argument `noise` (a [4, 5] float32 tensor) after autograd saved it" in finding.what
    assert "uninitialised memory (`empty_like`)" in finding.why
    assert "pass early_stop=False to `checkpoint` at" in finding.fix


@MODES
def test_each_fix_gives_the_plain_gradient_and_no_finding(deep: bool) -> None:
    x = torch.randn(4, 5, requires_grad=True)
    torch.manual_seed(3)
    plain = torch.autograd.grad(_rrelu(x).sum(), x)[0]
    for kwargs in ({"use_reentrant": False, "early_stop": False}, {"use_reentrant": True}):
        torch.manual_seed(3)
        x.grad = None
        checkpoint(_rrelu, x, **kwargs).sum().backward()
        assert torch.equal(x.grad, plain), kwargs

        def fixed(kwargs: dict[str, bool] = kwargs) -> None:
            checkpoint(_rrelu, x, **kwargs).sum().backward()

        assert _watch(fixed, deep) == [], kwargs


@MODES
def test_nothing_is_said_where_backward_reads_what_the_kernel_wrote(deep: bool) -> None:
    x = torch.randn(4, 5, requires_grad=True)
    buffer = torch.empty(4, 5)
    cases = {
        "no checkpoint": lambda: _rrelu(x).sum().backward(),
        "eval mode": lambda: checkpoint(torch.nn.RReLU().eval(), x * 1.0, use_reentrant=False).sum().backward(),
        # sin saves rrelu's output after its kernel: the recompute runs the kernel again
        "a later save": lambda: checkpoint(lambda t: _rrelu(t).sin(), x, use_reentrant=False).sum().backward(),
        # the recompute saves the buffer as the forward left it: the drawn noise
        "a buffer from outside": lambda: checkpoint(
            lambda t: RRELU(t * 1.0, buffer, 0.1, 0.3, True), x, use_reentrant=False
        ).sum().backward(),
    }
    for name, case in cases.items():
        assert _watch(case, deep) == [], name


@MODES
def test_a_buffer_from_outside_rewritten_before_backward_is_reported(deep: bool) -> None:
    """The op itself, its noise kept outside the region: the recompute saves the buffer as it is at
    backward, which another call has redrawn."""
    x = torch.randn(4, 5, requires_grad=True)
    buffer = torch.empty(4, 5)

    def run() -> None:
        y = checkpoint(lambda t: RRELU(t * 1.0, buffer, 0.1, 0.3, True), x, use_reentrant=False)
        RRELU(torch.randn(4, 5), buffer, 0.1, 0.3, True)
        y.sum().backward()

    [finding] = _watch(run, deep)
    assert (finding.code, finding.cause) == ("IPD111", RecomputeCause.SAVED_BEFORE_WRITE)
    assert "a tensor from outside the region, is saved as it is at backward" in finding.why


@pytest.mark.parametrize("deep", [True, False], ids=["deep", "fast"])
def test_outside_checkpoint_a_second_call_on_the_same_noise_is_still_an_overwrite(deep: bool) -> None:
    """The first node's saved noise is redrawn by the second call: IPD104 (no version bump), while
    each call's write into the noise its own node saved is not reported."""
    x = torch.randn(4, 5, requires_grad=True)

    def run() -> None:
        noise = torch.empty(4, 5)
        y1 = RRELU(x * 1.0, noise, 0.1, 0.3, True)
        y2 = RRELU(x * 2.0, noise, 0.1, 0.3, True)  # <second>
        (y1 + y2).sum().backward()

    # The fast tracer settles the kernel's write only once autograd has named its node, after the
    # kernel returned: sooner, its own save could not be told from the first call's.
    findings = _watch(run, deep=deep, select=["IPD101", "IPD104"])
    assert [f.code for f in findings] == ["IPD104"]
    assert findings[0].mutation.line == run.__code__.co_firstlineno + 3


def test_the_fused_observer_saves_none_of_what_it_writes() -> None:
    x = torch.randn(4, 5, requires_grad=True)
    written = [torch.tensor([float("inf")]), torch.tensor([float("-inf")]), torch.tensor([1.0]), torch.tensor([0], dtype=torch.int32)]
    op = torch.ops.aten._fused_moving_avg_obs_fq_helper
    on = torch.tensor([1])
    saved = [_saves(op.default, lambda: op(x * 1.0, on, on, *written, 0.01, 0, 255, 0), t) for t in written]
    assert all(before + after and not any(before + after) for before, after in saved)
