"""The fast tracer's `InplaceCalls` mode is on the stack only while it has work (`inplace_entry.py`)."""

from __future__ import annotations

import gc
import inspect
import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.functional import relu as relu_bound_before  # bound at import, before any session
from torch.overrides import TorchFunctionMode

from inplace_doctor.events import CallerInputWritten, OriginalValueRead
from inplace_doctor.trace.reads.inplace_calls import InplaceCalls
from inplace_doctor.trace.tracer import Tracer


class Events(list):
    def __call__(self, event):
        self.append(event)


def _modes() -> list[object]:
    return [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]


def _ours() -> list[object]:
    return [m for m in _modes() if isinstance(m, InplaceCalls)]


class _Seen(nn.Module):
    """Records, at each of its calls, whether one of the tool's function modes is on the stack."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(bool(_ours()))
        return x


def test_a_steady_step_with_nothing_awaited_runs_without_the_mode() -> None:
    torch.manual_seed(0)
    probe = _Seen()
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), probe, nn.Linear(8, 2))
    events = Events()
    with Tracer(events, fast=True) as tracer:
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            model(torch.randn(4, 8)).sum().backward()
        assert not _ours()
    assert probe.seen == [False] * 3 and tracer._entries.pushes == 0
    assert not _modes() and not events


def test_an_inplace_call_pushes_the_mode_until_what_it_overwrote_is_gone() -> None:
    events = Events()
    x = torch.randn(4, 8)
    with Tracer(events, fast=True) as tracer:
        h = x * 2
        out = F.relu(h, inplace=True)
        assert _ours() == [tracer.inplace_calls]  # `h` awaits its read
        torch.cat([h, out])  # the read the out-of-place program would serve with the original
        assert len([e for e in events if isinstance(e, OriginalValueRead)]) == 1
        del h
        gc.collect()
        F.relu(out)  # a safe point: nothing is awaited, the mode goes
        assert not _ours()
        out2 = F.relu(out, inplace=True)
        del out
        F.dropout(out2, 0.0)
        assert not _ours()
    assert not _modes()


def test_augmented_assignment_in_a_user_file_is_seen_with_the_mode_off() -> None:
    events = Events()
    with Tracer(events, fast=True):
        x = torch.randn(4)
        kept = x
        assert not _ours()
        x += 1
        assert x is not kept  # the alias handed back
        torch.sin(kept)  # reads the object `+=` overwrote
    reads = [e for e in events if isinstance(e, OriginalValueRead)]
    assert len(reads) == 1 and reads[0].kind == "augmented" and reads[0].write.site.op == "add_"
    assert not _modes()


@pytest.mark.parametrize("call", ["bound before", "module attribute", "nn.ReLU", "positional flag"])
def test_a_functional_inplace_call_is_seen_however_the_function_was_reached(call: str) -> None:
    """`from torch.nn.functional import relu` at import holds torch's function object: its code, not
    a module attribute, is what the session swaps, so the fast tracer reports the read the deep
    tracer does."""
    found = {}
    for fast in (False, True):
        events = Events()
        with Tracer(events, fast=fast):
            h = torch.randn(4) * 2
            if call == "bound before":
                out = relu_bound_before(h, inplace=True)
            elif call == "module attribute":
                out = F.relu(h, inplace=True)
            elif call == "nn.ReLU":
                out = nn.ReLU(inplace=True)(h)
            else:
                out = F.hardtanh(h, -1.0, 1.0, True)
            torch.cat([h, out])
        found[fast] = [(e.write.site.op, e.kind) for e in events if isinstance(e, OriginalValueRead)]
    assert len(found[False]) == 1 and found[True] == found[False]


def test_torchs_functions_keep_their_identity_signature_and_source_and_script() -> None:
    dropout, code = F.dropout, F.dropout.__code__
    signature, source = inspect.signature(F.dropout), inspect.getsource(F.dropout)

    class Scripted(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.dropout(F.relu(x, inplace=True), 0.0, self.training)

    with Tracer(Events(), fast=True):
        assert F.dropout is dropout and F.dropout.__code__ is not code
        assert inspect.signature(F.dropout) == signature and inspect.getsource(F.dropout) == source
        assert nn.TransformerEncoderLayer(8, 2).activation_relu_or_gelu == 1  # `activation is F.relu`
        scripted = torch.jit.script(Scripted())
        assert torch.equal(scripted(torch.ones(2)), torch.ones(2))
    assert F.dropout.__code__ is code and not hasattr(F, "_inplace_doctor_entry")


@pytest.mark.parametrize("fast", [True, False])
def test_nested_sessions_report_as_the_deep_tracer_does_and_leave_no_mode(fast: bool) -> None:
    """Both modes on: the inner session's call hands back the outer's alias, which it does not
    alias again (`out is not real`): the outer session reports the read, in both tracers."""
    outer_events, inner_events = Events(), Events()
    with Tracer(outer_events, fast=fast) as outer:
        with Tracer(inner_events, fast=fast) as inner:
            h = torch.randn(4) * 2
            out = F.relu(h, inplace=True)
            assert outer.inplace_calls in _ours()
            assert _ours()[-1] is (outer.inplace_calls if fast else inner.inplace_calls)
            torch.cat([h, out])
        assert inner.inplace_calls not in _ours()
    assert not _modes()
    assert [type(e) for e in outer_events] == [OriginalValueRead] and inner_events == []


class _Counting(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("user_first", [True, False])
def test_a_mode_the_program_enters_inside_the_watch_stays_above_ours(user_first: bool) -> None:
    events = Events()
    with Tracer(events, fast=True) as tracer:
        h = torch.randn(4) * 2
        if not user_first:
            out = F.relu(h, inplace=True)  # ours pushed first
        with _Counting() as user:
            if user_first:
                out = F.relu(h, inplace=True)  # ours inserted below the program's
            assert _modes() == [tracer.inplace_calls, user]
            torch.cat([h, out])
        assert _modes() == [tracer.inplace_calls]  # the program's `__exit__` took its own mode off
        assert user.calls == (2 if user_first else 1)  # as without the tool: relu (if inside), cat
    assert not _modes()
    assert len([e for e in events if isinstance(e, OriginalValueRead)]) == 1


class _ClampInPlace(nn.Module):
    """An `inplace=True` module whose write is no `inplace=True` call: only the module's flag asks for it."""

    def __init__(self) -> None:
        super().__init__()
        self.inplace = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clamp_(min=0)


@pytest.mark.parametrize("fast", [True, False])
def test_a_module_flag_write_into_the_callers_tensor_pushes_the_mode_at_the_top_level_return(fast: bool) -> None:
    events = Events()
    model = nn.Sequential(_ClampInPlace(), nn.Linear(4, 2))
    x = torch.randn(3, 4)
    with Tracer(events, fast=fast):
        model(x)
        assert _ours()  # `x` awaits the caller's read
        x.sum()
        del x
        gc.collect()
        model(torch.randn(3, 4))  # its argument, written, awaits a read until it is freed
        gc.collect()
        F.relu(torch.ones(1))  # a safe point
        if fast:
            assert not _ours()  # nothing awaited: popped
    assert len([e for e in events if isinstance(e, CallerInputWritten)]) == 1
    assert not _modes()


@pytest.mark.parametrize("first_ends_first", [True, False])
def test_sessions_of_two_threads_put_torchs_code_back_in_either_end_order(first_ends_first: bool) -> None:
    """The swapped `__code__` is one change per process (`shared_patches.Shared`): the session left in
    still sees its thread's in-place calls, and the last one out puts torch's code back."""
    code = F.relu.__code__
    entered = [threading.Event(), threading.Event()]
    ended = [threading.Event(), threading.Event()]
    found: list[list[object]] = [[], []]
    errors: list[BaseException] = []

    def run(me: int, waits_for_end: bool) -> None:
        try:
            events = Events()
            with Tracer(events, fast=True):
                entered[me].set()
                assert entered[1 - me].wait(60)
                if waits_for_end:
                    assert ended[1 - me].wait(60)
                    assert F.relu.__code__ is not code  # still swapped for the session left in
                h = torch.randn(4) * 2
                out = F.relu(h, inplace=True)
                torch.cat([h, out])
                del h, out
            found[me] = [e for e in events if isinstance(e, OriginalValueRead)]
        except BaseException as exc:  # noqa: BLE001 (re-raised in the main thread)
            errors.append(exc)
        finally:
            ended[me].set()

    threads = [
        threading.Thread(target=run, args=(0, not first_ends_first)),
        threading.Thread(target=run, args=(1, first_ends_first)),
    ]
    threads[0].start()
    assert entered[0].wait(60)
    threads[1].start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    assert [len(f) for f in found] == [1, 1]
    assert F.relu.__code__ is code and not hasattr(F, "_inplace_doctor_entry")
    assert "__iadd__" not in vars(torch.Tensor)


def test_fail_fast_keeps_the_mode_on_throughout() -> None:
    """Its mode settles the writes made so far as each call returns: on for every call, as before."""
    probe = _Seen()
    model = nn.Sequential(nn.Linear(8, 8), probe)
    with Tracer(Events(), fast=True, fail_fast=True) as tracer:
        model(torch.randn(4, 8)).sum().backward()
        assert _ours() == [tracer.inplace_calls]
    assert probe.seen == [True] and not _modes()
