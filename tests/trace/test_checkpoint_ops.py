"""The fast tracer's per-op interception inside checkpoint regions (`trace/checkpoint/checkpoint_ops.py`, issue 26).

Only a region's forward and recompute run ops through Python; the mode is off
the stack before and after; the program computes exactly what it computes
without the tool; and findings equal the deep tracer's, reentrant, nested and
non-reentrant.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

import inplace_doctor as ipd
from inplace_doctor._compat import remove_dispatch_mode
from inplace_doctor.rules import FAST_MODE_RULES


def _fast() -> Any:
    session = ipd.watch(deep=False, select=sorted(FAST_MODE_RULES))
    assert not session.deep
    return session


def _findings(session: Any) -> list[tuple[Any, ...]]:
    return sorted((f.code, f.mutation.line, f.message) for f in session.findings)


class Counting(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


def test_the_mode_is_on_only_while_a_region_runs() -> None:
    torch.manual_seed(0)
    pre, block, post = nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 8), nn.GELU()), nn.Linear(8, 2)
    x = torch.randn(4, 8)
    depth: list[int] = []

    def region(t: torch.Tensor) -> torch.Tensor:
        depth.append(torch._C._len_torch_dispatch_stack())
        return block(t)

    session = _fast()
    with session:
        h = pre(x)
        assert torch._C._len_torch_dispatch_stack() == 0
        y = post(checkpoint(region, h, use_reentrant=False))
        assert torch._C._len_torch_dispatch_stack() == 0
        y.sum().backward()
        assert torch._C._len_torch_dispatch_stack() == 0
    ops = session.tracer.checkpoint_ops
    assert depth == [1, 1]  # the forward and the recompute, each with the mode on
    assert ops.regions == 2 and ops.mode.ops > 0
    assert session.tracer._recompute.compared > 0


def test_the_reentrant_form_turns_the_mode_on_for_its_recompute_only() -> None:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
    x = torch.randn(4, 8, requires_grad=True)
    session = _fast()
    with session:
        y = checkpoint(block, x, use_reentrant=True)
        assert session.tracer.checkpoint_ops.regions == 0  # its forward runs under no_grad: nothing to see
        y.sum().backward()
    assert session.tracer.checkpoint_ops.regions == 1


def test_a_program_without_checkpoint_sends_no_op_through_the_mode() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    session = _fast()
    with session:
        model(torch.randn(2, 3, 6, 6)).sum().backward()
    assert session.tracer.checkpoint_ops.regions == 0 and session.tracer.checkpoint_ops.mode.ops == 0


class Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.inner = nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.inner, torch.relu(self.conv(x)), use_reentrant=False)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_nested_regions_report_what_the_deep_tracer_reports(reentrant: bool) -> None:
    def run(session: Any) -> list[tuple[Any, ...]]:
        torch.manual_seed(0)
        model = Nested()
        x = torch.randn(2, 3, 6, 6, requires_grad=True)
        with session:
            checkpoint(model, x, use_reentrant=reentrant).sum().backward()
        assert torch._C._len_torch_dispatch_stack() == 0
        return _findings(session)

    deep = run(ipd.watch(select=sorted(FAST_MODE_RULES)))
    assert deep and {f[0] for f in deep} == {"IPD108"}  # the inner BatchNorm, run again by each recompute
    assert run(_fast()) == deep


def test_a_checkpointed_training_step_is_bit_identical_with_and_without_the_fast_tracer() -> None:
    def steps(traced: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        block = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.3))
        head = nn.Sequential(nn.Flatten(), nn.Linear(288, 2))
        params = [*block.parameters(), *head.parameters()]
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        for reentrant in (False, True):
            x = torch.randn(2, 3, 8, 8, requires_grad=True)
            opt.zero_grad()
            if traced:
                with _fast():
                    head(checkpoint(block, x, use_reentrant=reentrant)).sum().backward()
            else:
                head(checkpoint(block, x, use_reentrant=reentrant)).sum().backward()
            opt.step()
        return [t.detach().clone() for t in [*params, *block.buffers(), x.grad]]

    assert all(torch.equal(a, b) for a, b in zip(steps(True), steps(False), strict=True))


def test_a_mode_the_program_enters_inside_a_region_stays_its_own() -> None:
    block = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
    counters: list[Counting] = []

    def region(t: torch.Tensor) -> torch.Tensor:
        counting = Counting()
        counters.append(counting)
        with counting:
            return block(t)

    x = torch.randn(4, 8, requires_grad=True)
    expected = torch.autograd.grad(checkpoint(region, x, use_reentrant=False).sum(), x)[0]
    plain_ops = [c.ops for c in counters]
    counters.clear()
    with _fast():
        got = torch.autograd.grad(checkpoint(region, x, use_reentrant=False).sum(), x)[0]
    assert torch.equal(got, expected) and [c.ops for c in counters] == plain_ops


def test_a_tensor_subclass_built_inside_a_region_is_built_as_without_the_tool() -> None:
    class Tagged(torch.Tensor):
        pass

    def region(t: torch.Tensor) -> torch.Tensor:
        tagged = Tagged(t.detach())
        assert type(tagged) is Tagged
        return t * 2

    x = torch.randn(3, requires_grad=True)
    with _fast():
        checkpoint(region, x, use_reentrant=False).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0))


def test_the_mode_comes_off_the_stack_under_modes_pushed_after_it() -> None:
    from inplace_doctor import _compat

    ours, theirs = Counting(), Counting()
    _compat.push_dispatch_mode(ours)
    _compat.push_dispatch_mode(theirs)
    try:
        remove_dispatch_mode(ours)
        assert torch._C._len_torch_dispatch_stack() == 1 and torch._C._get_dispatch_stack_at(0) is theirs
        remove_dispatch_mode(ours)  # gone already: nothing happens
        assert torch._C._len_torch_dispatch_stack() == 1
    finally:
        while torch._C._len_torch_dispatch_stack():
            _compat.pop_dispatch_mode(None)


def test_no_region_is_watched_when_neither_rule_reads_it_nor_while_memory_is_measured() -> None:
    from inplace_doctor.trace.tracer import Tracer

    assert ipd.watch(deep=False, select=["IPD101"]).tracer.checkpoint_ops is None
    assert ipd.watch(deep=False, select=["IPD108"]).tracer._recompute is None  # the BatchNorm check only
    assert ipd.watch(deep=False, select=["IPD108"]).tracer.checkpoint_ops is not None
    measuring = Tracer(lambda event: None, fast=True, observe_reads=False)  # fingerprints allocate
    assert measuring.checkpoint_ops is None and measuring._recompute is None


class CheckpointFunction(torch.autograd.Function):
    """A library's own reentrant checkpoint, as DeepSpeed, Megatron and fairscale write theirs: the
    forward under no_grad, the recompute and a nested backward in the Function's backward."""

    @staticmethod
    def forward(ctx: Any, run: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.run = run
        ctx.save_for_backward(x)
        with torch.no_grad():
            return run(x)  # type: ignore[no-any-return]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            out = ctx.run(x)
        torch.autograd.backward(out, grad)
        return None, x.grad


class Scaled(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2


def test_a_librarys_own_reentrant_checkpoint_is_seen_as_the_deep_tracer_sees_it() -> None:
    def run(session: Any) -> tuple[list[tuple[Any, ...]], int]:
        torch.manual_seed(0)
        block = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
        x = torch.randn(2, 3, 6, 6, requires_grad=True)
        with session:
            Scaled.apply(CheckpointFunction.apply(block, x)).sum().backward()
        ops = session.tracer.checkpoint_ops
        return _findings(session), ops.regions if ops is not None else -1

    deep, _ = run(ipd.watch(select=sorted(FAST_MODE_RULES)))
    fast, regions = run(_fast())
    assert deep and {f[0] for f in deep} == {"IPD108"} and fast == deep  # running stats, num_batches_tracked
    assert regions == 1  # the checkpoint's backward; `Scaled`'s ran without the mode


def test_a_watch_left_inside_a_region_takes_its_mode_off_the_stack() -> None:
    session = _fast()
    session.__enter__()

    def region(t: torch.Tensor) -> torch.Tensor:
        assert torch._C._len_torch_dispatch_stack() == 1
        session.__exit__(None, None, None)
        assert torch._C._len_torch_dispatch_stack() == 0
        return t * 2

    x = torch.randn(3, requires_grad=True)
    checkpoint(region, x, use_reentrant=False).sum().backward()
    assert torch._C._len_torch_dispatch_stack() == 0 and torch.equal(x.grad, torch.full((3,), 2.0))
