"""The fast tracer's per-op interception while a stale `state_dict()` alias awaits its use (`pending_reads.py`)."""

from __future__ import annotations

import gc

import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from inplace_doctor.events import HeldTensorUsed
from inplace_doctor.trace.tracer import Tracer


class Events(list):
    def __call__(self, event):
        self.append(event)


def test_the_read_mode_is_on_only_from_the_write_that_made_an_alias_stale_to_the_first_write_after_its_use() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    events = Events()
    with Tracer(events, fast=True) as tracer:
        reads = tracer.pending_reads
        assert reads is not None
        best = model.state_dict()
        model(torch.randn(3, 4)).sum().backward()
        assert _get_current_dispatch_mode() is None  # nothing stale: no op but writes enters Python
        opt.step()  # writes the parameters `best` aliases
        assert reads.on and _get_current_dispatch_mode() is reads.mode
        model.load_state_dict(best)  # the use: a copy of the stale alias onto its own parameter
        assert any(isinstance(e, HeldTensorUsed) for e in events)
        torch.zeros(1).add_(1)  # the next write turns the mode off
        assert not reads.on and _get_current_dispatch_mode() is None
        assert reads.turned_on == 1


def test_a_stale_alias_freed_turns_the_read_mode_off_at_the_next_write() -> None:
    model = nn.Linear(4, 2)
    with Tracer(Events(), fast=True) as tracer:
        reads = tracer.pending_reads
        snapshot = model.state_dict()
        with torch.no_grad():
            model.weight.mul_(2)
        assert reads.on
        del snapshot
        gc.collect()
        torch.zeros(1).add_(1)
        assert not reads.on and _get_current_dispatch_mode() is None


def test_the_read_mode_does_not_outlive_the_tracer() -> None:
    model = nn.Linear(4, 2)
    with Tracer(Events(), fast=True) as tracer:
        snapshot = model.state_dict()
        with torch.no_grad():
            model.weight.mul_(2)
        assert tracer.pending_reads.on
    assert _get_current_dispatch_mode() is None
    assert snapshot  # held until here


def test_a_graph_tensor_changed_under_no_grad_turns_the_read_mode_on_until_its_use_is_hooked() -> None:
    from inplace_doctor.events import GraphTensorChangedOutsideAutograd

    events = Events()
    x = torch.randn(3, requires_grad=True)
    with Tracer(events, fast=True) as tracer:
        reads = tracer.pending_reads
        h = x * 2
        assert not reads.on
        with torch.no_grad():
            h.mul_(3)  # autograd does not record it: h's history still describes x * 2
        assert reads.on and _get_current_dispatch_mode() is reads.mode
        y = h.sin()  # the use
        y.exp()  # its node exists now: the prediction is made and hooked
        assert any(isinstance(e, GraphTensorChangedOutsideAutograd) for e in events)
        torch.zeros(1).add_(1)
        assert not reads.on and _get_current_dispatch_mode() is None


def test_detach_and_data_are_seen_while_the_fast_tracer_runs_and_restored_after() -> None:
    detach, had_data = torch.Tensor.__dict__["detach"], "data" in torch.Tensor.__dict__
    x = torch.randn(3, requires_grad=True)
    with Tracer(Events(), fast=True) as tracer:
        h = x * 2
        h.data.mul_(2)  # through `.data`: a change autograd does not see
        assert tracer.pending_reads.on
        assert torch.equal(h.detach(), h.data)
    assert torch.Tensor.__dict__["detach"] is detach and ("data" in torch.Tensor.__dict__) == had_data
    assert _get_current_dispatch_mode() is None
