"""Naming modules from the user's own variables keeps none of them alive."""

from __future__ import annotations

import weakref

import torch

import inplace_doctor as ipd


def test_reading_the_callers_names_keeps_none_of_its_locals_alive() -> None:
    """`watch(model)` names `model` from the caller's locals: on Python 3.11/3.12 `frame.f_locals`
    leaves a dict on the frame that would keep a tensor the caller deletes alive until it returns."""

    def train() -> bool:
        model = torch.nn.Linear(2, 2)
        t = torch.randn(2)
        freed = weakref.ref(t)
        with ipd.watch(model) as session:
            model(torch.randn(1, 2)).sum().backward()
            t.add_(1)  # a write the tool sees, so it has looked at this frame's names
        del t
        assert session.report() is not None
        return freed() is None

    assert train()


def test_a_watch_per_step_names_the_modules_as_the_program_holds_them_at_each_session() -> None:
    """Nothing learned in one session names a module in the next: a renamed attribute and a new
    submodule are named as they are when the next session meets them."""
    import types

    holder = types.SimpleNamespace(model=torch.nn.Sequential(torch.nn.Linear(2, 2)))
    first = holder.model[0]
    with ipd.watch() as session:
        holder.model(torch.randn(1, 2))
    assert session.tracer.modules.path_of(first) == "holder.model.0"
    holder.net = holder.model
    del holder.model
    holder.net.append(torch.nn.Linear(2, 2))
    with ipd.watch() as session:
        holder.net(torch.randn(1, 2))
    assert session.tracer.modules.path_of(first) == "holder.net.0"
    assert session.tracer.modules.path_of(holder.net[1]) == "holder.net.1"
