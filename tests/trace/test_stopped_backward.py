"""A prediction under the node where a backward raised stays a warning when its graph is freed.

Backward stops at the first stale saved tensor it unpacks. A second one on the same node (BatchNorm's
input and its running mean) or on a node under it was not reached *because of that error*; the graph
the program drops afterwards, inside the watch, says nothing about whether backward would reach it.
Before, its release was read as "never backpropagated" and the prediction was dropped, so whether it
was reported depended on when the garbage collector freed the graph. A graph freed without any
backward still drops its predictions.
"""

from __future__ import annotations

import gc

import pytest
import torch

import inplace_doctor as ipd
from inplace_doctor.causes import Unreached
from inplace_doctor.findings import Severity


def _write_lines(findings: list) -> dict[int, tuple[bool, Unreached | None, Severity]]:
    return {f.mutation.line: (f.confirmed, f.unreached, f.severity) for f in findings if f.code == "IPD101"}


def _line(offset: int = 0) -> int:
    import sys

    return sys._getframe(1).f_lineno + offset


@pytest.mark.parametrize("deep", [False, True], ids=["fast", "deep"])
@pytest.mark.parametrize("retain", [False, True], ids=["freed-by-backward", "retained"])
def test_second_stale_field_of_the_node_that_raised(deep: bool, retain: bool) -> None:
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(3).eval()  # eval: the running stats are saved and read by backward
    x = torch.randn(4, 3, requires_grad=True)
    with ipd.watch(deep=deep) as session:
        b = x * 1
        y = bn(b)
        b.add_(1); first = _line()  # noqa: E702
        bn.running_mean.add_(1); second = _line()  # noqa: E702
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward(retain_graph=retain)
        del y, b
        gc.collect()  # the graph is gone inside the session
    found = _write_lines(session.findings)
    assert set(found) == {first, second}, session.findings
    confirmed = [line for line, (ok, _, _) in found.items() if ok]
    assert len(confirmed) == 1, found  # the field autograd unpacked first
    (other,) = {first, second} - set(confirmed)
    assert found[other] == (False, Unreached.STOPPED_AT_INPLACE_ERROR, Severity.WARNING)


@pytest.mark.parametrize("deep", [False, True], ids=["fast", "deep"])
def test_stale_save_on_a_node_under_the_one_that_raised(deep: bool) -> None:
    x = torch.randn(5, requires_grad=True)
    with ipd.watch(deep=deep) as session:
        a = x * 1
        h = a.sin()  # SinBackward0 saves a: under ExpBackward0 below
        a.add_(1); lower = _line()  # noqa: E702
        z = (h * 2).exp()  # ExpBackward0 saves its result
        z.add_(1); upper = _line()  # noqa: E702
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            z.sum().backward()
        del z, h, a
        gc.collect()
    found = _write_lines(session.findings)
    assert found[upper][0] is True
    assert found[lower] == (False, Unreached.STOPPED_AT_INPLACE_ERROR, Severity.WARNING)


@pytest.mark.parametrize("deep", [False, True], ids=["fast", "deep"])
def test_a_graph_freed_without_backward_still_drops_its_prediction(deep: bool) -> None:
    """Beside a backward that raised: another graph, never backpropagated, is dropped as before."""
    x = torch.randn(5, requires_grad=True)
    with ipd.watch(deep=deep) as session:
        c = x * 1
        target = c.sin()  # an RL target computed with grad and never backpropagated
        c.add_(1)
        a = x * 1
        z = a.exp()
        z.add_(1); raised = _line()  # noqa: E702
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            z.sum().backward()
        del target, c, z, a
        gc.collect()
    assert set(_write_lines(session.findings)) == {raised}, session.findings


@pytest.mark.parametrize("deep", [False, True], ids=["fast", "deep"])
def test_predictions_beside_the_raising_node_in_its_graph_and_outside_it(deep: bool) -> None:
    """The backward that raised stopped before a sibling branch of its own graph (a warning, kept when
    the graph is freed), not before another graph the program keeps alive (info: no backward reached it)."""
    x = torch.randn(5, requires_grad=True)
    with ipd.watch(deep=deep) as session:
        kept = x * 1
        other = kept.sin()  # another graph, alive and never backpropagated
        kept.add_(1); outside = _line()  # noqa: E702
        a, b = x * 1, x * 1
        loss = a.exp().sum() + b.cos().sum()  # CosBackward0 saves b
        b.add_(1); sibling = _line()  # noqa: E702
        y = a.exp()  # ExpBackward0 saves its result
        loss = loss + y.sum()
        y.add_(1); raised = _line()  # noqa: E702
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()  # reaches y's ExpBackward0 or CosBackward0 first: one raises
        del loss, y, a, b
        gc.collect()  # the graph is freed inside the session
    found = _write_lines(session.findings)
    confirmed = {line for line, (ok, _, _) in found.items() if ok}
    assert len(confirmed) == 1 and confirmed <= {sibling, raised}, found
    (cut,) = {sibling, raised} - confirmed
    assert found[cut] == (False, Unreached.STOPPED_AT_INPLACE_ERROR, Severity.WARNING)
    assert found[outside] == (False, Unreached.NOT_REACHED_IN_WATCH, Severity.INFO)
    assert other is not None
