"""The one per-op mode class (`per_op.py`): what every user of it gets without writing it again."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from inplace_doctor.trace.deep.per_op import OpWork, PerOpMode
from inplace_doctor.trace.owner import Busy
from inplace_doctor.trace.raised.blame import raised_by_the_tool
from inplace_doctor.trace.tracer import Tracer


class Log(OpWork):
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bool]] = []
        self.failures: list[str] = []

    def before(self, func: Any, args: Any, kwargs: Any, written: Any, node: Any) -> Any:
        return func.__name__

    def after(self, token: Any, func: Any, args: Any, kwargs: Any, out: Any, written: Any, batch_norm: bool, node: Any) -> None:
        self.seen.append((token, func.__name__, bool(written)))

    def failed(self, func: Any, exc: BaseException, node: Any) -> None:
        self.failures.append(func.__name__)


def test_each_op_is_handed_to_the_work_with_what_it_writes_and_the_tools_own_ops_are_not() -> None:
    busy, work = Busy(), Log()
    x = torch.ones(3)
    with PerOpMode(busy, work) as mode:
        y = x.mul(2)
        y.add_(1)
        with busy:
            x.sin()
    assert work.seen == [("mul.Tensor", "mul.Tensor", False), ("add_.Tensor", "add_.Tensor", True)]
    assert mode.ops == 2 and torch.equal(y, torch.full((3,), 3.0))


def test_forward_only_passes_backward_ops_straight_through() -> None:
    x = torch.ones(3, requires_grad=True)
    counts = []
    for forward_only in (False, True):
        work = Log()
        with PerOpMode(Busy(), work, forward_only=forward_only) as mode:
            (x * 2).sum().backward()
        counts.append(mode.ops)
        x.grad = None
    assert counts[1] < counts[0] and counts[1] == 3  # mul, sum and the ones backward starts from: no node runs them


def test_an_op_that_raises_is_the_programs_error_and_the_work_is_told() -> None:
    work, x, y = Log(), torch.ones(3), torch.ones(2)
    with pytest.raises(RuntimeError) as raised, PerOpMode(Busy(), work):
        x.add_(y)  # shapes that do not broadcast
    assert work.failures == ["add_.Tensor"] and work.seen == []
    assert not raised_by_the_tool(raised.value)


def test_the_deep_mode_and_the_fast_tracers_per_op_users_are_all_per_op_modes() -> None:
    deep = Tracer(lambda event: None, fast=False)
    fast = Tracer(lambda event: None, fast=True)
    modes = [deep._mode, fast.pending_reads.mode, fast.checkpoint_ops.mode, fast.inplace_calls.suspects.mode]
    assert all(isinstance(mode, PerOpMode) for mode in modes)
    assert fast.inplace_calls.suspects.mode.forward_only
