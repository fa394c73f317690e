"""The fast tracer's per-op interception while a stale `state_dict()` alias awaits its use (`pending_reads.py`)."""

from __future__ import annotations

import contextlib
import gc

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from inplace_doctor.events import HeldTensorUsed
from inplace_doctor.trace.tracer import Tracer


def _python_key_on() -> bool:
    return torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.Python)


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


@pytest.mark.parametrize("under_inference_mode", [False, True])
def test_a_stale_alias_freed_turns_the_read_mode_off_at_the_next_write(under_inference_mode: bool) -> None:
    """Not inside `torch.inference_mode`: popped there, the guard's end would switch the Python keys
    back on over an empty stack; the first write after the block pops it."""
    model = nn.Linear(4, 2)
    counter = torch.zeros(1)  # made outside: one made under inference mode would be an inference tensor, no kernel sees it
    with Tracer(Events(), fast=True) as tracer:
        reads = tracer.pending_reads
        snapshot = model.state_dict()
        with torch.no_grad():
            model.weight.mul_(2)
        assert reads.on
        with torch.inference_mode() if under_inference_mode else contextlib.nullcontext():
            del snapshot
            gc.collect()
            counter.add_(1)
            assert reads.on is under_inference_mode
        counter.add_(1)
        assert not reads.on and _get_current_dispatch_mode() is None and not _python_key_on()


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


def test_the_pytorch_fact_a_mode_pushed_inside_inference_mode_is_not_called_after_it() -> None:
    """The guard restores this thread's dispatch keys at its end: the mode stays on the stack, dead."""
    from torch.utils._python_dispatch import TorchDispatchMode, _pop_mode, _push_mode

    class Counting(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Counting.ops += 1
            return func(*args, **(kwargs or {}))

    x = torch.randn(3, requires_grad=True)
    with torch.inference_mode():
        _push_mode(Counting())
    try:
        assert _get_current_dispatch_mode() is not None and not _python_key_on()
        x.sin()
        assert Counting.ops == 0
    finally:
        _pop_mode()


def test_the_read_mode_turned_on_inside_inference_mode_still_sees_ops_after_the_block() -> None:
    """The inference-mode guard puts the thread's dispatch keys back as they were at its start: the
    mode pushed inside would stay on the stack, never called (the PyTorch fact), unless switched back on."""
    from inplace_doctor.events import GraphTensorChangedOutsideAutograd

    events = Events()
    x = torch.randn(3, requires_grad=True)
    with Tracer(events, fast=True) as tracer:
        reads = tracer.pending_reads
        h = x * 2
        with torch.inference_mode():
            h.mul_(3)  # a normal tensor: its write reaches the kernels like any other
            assert reads.on and _python_key_on()
        assert _get_current_dispatch_mode() is reads.mode and _python_key_on()
        seen = reads.mode.ops
        h.sin().exp()  # the use, and the op after it that finds its node
        assert reads.mode.ops == seen + 2
        assert any(isinstance(e, GraphTensorChangedOutsideAutograd) for e in events)
        torch.zeros(1).add_(1)
        assert not reads.on
    assert _get_current_dispatch_mode() is None and not _python_key_on()


def test_inference_mode_blocks_that_push_nothing_keep_the_keys_as_pytorch_leaves_them() -> None:
    with Tracer(Events(), fast=True):
        with torch.inference_mode():
            torch.ones(2).add_(1)
        assert _get_current_dispatch_mode() is None and not _python_key_on()


def test_sessions_nested_and_of_two_threads_put_inference_mode_back() -> None:
    """`inference_mode.__exit__` is wrapped once while any session runs and is PyTorch's own again
    when the last ends, in whatever order; its `__enter__` is never touched. In a fresh interpreter
    (sessions ending out of order leave other global patches of the tracer behind)."""
    import subprocess
    import sys
    import textwrap

    program = textwrap.dedent(
        """
        import threading
        import torch
        from inplace_doctor.trace.tracer import Tracer

        cls = torch.autograd.grad_mode.inference_mode
        before = dict(cls.__dict__), torch.Tensor.__dict__["detach"]
        with Tracer(lambda e: None, fast=True):
            assert cls.__dict__["__exit__"] is not before[0]["__exit__"]
            with Tracer(lambda e: None, fast=True):
                pass
            assert cls.__dict__["__exit__"] is not before[0]["__exit__"]
        assert (dict(cls.__dict__), torch.Tensor.__dict__["detach"]) == before

        started, first_ended = threading.Event(), threading.Event()

        def second():
            with Tracer(lambda e: None, fast=True):
                started.set()
                first_ended.wait(60)
                with torch.inference_mode():
                    torch.ones(1).add_(1)

        worker = threading.Thread(target=second)
        with Tracer(lambda e: None, fast=True):
            worker.start()
            started.wait(60)
        first_ended.set()
        worker.join(60)
        assert (dict(cls.__dict__), torch.Tensor.__dict__["detach"]) == before
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
