"""The fast tracer's IPD105/IPD106 reads (`suspect_calls.py`): every op only inside a call handed a suspect."""

from __future__ import annotations

import gc

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode, _get_current_dispatch_mode_stack

from inplace_doctor.events import CallerInputWritten, HeldTensorUsed, OriginalValueRead
from inplace_doctor.trace.tracer import Tracer


class Events(list):
    def __call__(self, event):
        self.append(event)


class Wants(Events):
    """A sink whose rules read only `types` (as the rule dispatcher's `wants` answers)."""

    def __init__(self, *types: type) -> None:
        super().__init__()
        self.types = types

    def wants(self, event_type: type) -> bool:
        return event_type in self.types


def test_no_call_runs_under_the_read_mode_while_nothing_overwritten_is_alive() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 2))
    with Tracer(Events(), fast=True) as tracer:
        suspects = tracer.inplace_calls.suspects
        assert suspects is not None
        model(torch.randn(4, 8)).sum().backward()
        assert not suspects.pending()
    assert suspects.calls == 0 and suspects.mode.ops == 0


def test_only_the_call_handed_the_overwritten_object_runs_under_the_read_mode_and_reports_its_read() -> None:
    torch.manual_seed(0)
    events = Events()
    x = torch.randn(4, 8)
    with Tracer(events, fast=True) as tracer:
        suspects = tracer.inplace_calls.suspects
        h = x * 2
        out = F.relu(h, inplace=True)  # hands back an alias: `h` is the object the flag overwrote
        assert suspects.pending() and _get_current_dispatch_mode() is None
        torch.sin(out)  # continues with the result: no read of the original, no per-op mode
        assert suspects.calls == 0 and suspects.mode.ops == 0
        y = h + 1  # reads the overwritten object
        assert suspects.calls == 1 and suspects.mode.ops == 1
        assert _get_current_dispatch_mode() is None  # off again once that call returned
        assert not suspects.pending()  # the first read is reported: nothing awaited any more
        torch.cos(h)
        assert suspects.calls == 1
    read = [e for e in events if isinstance(e, OriginalValueRead)]
    assert len(read) == 1 and read[0].read.op == "aten.add" and read[0].kind == "flag"
    assert read[0].max_difference == float((x * 2).clamp(max=0).abs().max())  # the negatives relu zeroed
    assert torch.equal(y, h + 1)  # the program's own values: relu's


def test_an_overwritten_object_freed_ends_the_pending_window() -> None:
    with Tracer(Events(), fast=True) as tracer:
        suspects = tracer.inplace_calls.suspects
        h = torch.randn(16)
        h = F.relu(h, inplace=True)  # the original object is dropped: only the alias is left
        gc.collect()
        assert not suspects.pending()
        torch.sin(h)
    assert suspects.calls == 0


def test_a_caller_tensor_an_inplace_flag_wrote_is_awaited_until_the_callers_first_read() -> None:
    torch.manual_seed(0)
    events = Wants(CallerInputWritten)
    model = nn.Sequential(nn.ReLU(inplace=True), nn.Linear(8, 2))
    x = torch.randn(4, 8)
    with Tracer(events, fast=True) as tracer:
        suspects = tracer.inplace_calls.suspects
        model(x)
        assert suspects.awaiting and not suspects.overwritten  # IPD105 not wanted: nothing measured
        assert not [e for e in events if isinstance(e, CallerInputWritten)]  # asked for: reported only at a read
        x.mean()
        assert suspects.calls == 1 and not suspects.awaiting
        x.sum()
        assert suspects.calls == 1
    written = [e for e in events if isinstance(e, CallerInputWritten)]
    assert len(written) == 1 and written[0].read is not None and written[0].read.op == "aten.mean"


def test_a_caller_tensor_dropped_after_the_call_is_no_longer_awaited() -> None:
    model = nn.Sequential(nn.ReLU(inplace=True), nn.Linear(8, 2))
    x = torch.randn(4, 8)
    events = Events()
    tracer = Tracer(events, fast=True)
    # a known root: a model met outside one is named from the caller's variables, whose
    # `f_locals` snapshot (Python < 3.13) would hold `x` after the `del`
    tracer.modules.add_root(model, "model")
    with tracer:
        suspects = tracer.inplace_calls.suspects
        model(x)
        assert suspects.awaiting
        del x
        gc.collect()
        assert not suspects.pending()
    assert not [e for e in events if isinstance(e, CallerInputWritten)]


def test_the_read_mode_leaves_the_stack_even_when_a_write_in_the_call_pushed_the_stale_alias_mode_above_it() -> None:
    model = nn.Linear(4, 4)
    events = Events()
    with Tracer(events, fast=True) as tracer:
        suspects, reads = tracer.inplace_calls.suspects, tracer.pending_reads
        best = model.state_dict()
        h = torch.randn(4, 4)
        F.relu(h, inplace=True)
        assert not reads.on
        with torch.no_grad():
            torch.add(h, 1, out=model.weight)  # handed `h`; its write makes `best` stale: that mode goes on
        assert suspects.calls == 1 and reads.on
        assert _get_current_dispatch_mode_stack() == [reads.mode]  # ours popped from beneath it
        model.load_state_dict(best)
        assert any(isinstance(e, HeldTensorUsed) for e in events)
    assert _get_current_dispatch_mode() is None


def test_the_snapshot_the_tool_copies_is_not_a_write_of_the_program() -> None:
    # silu's change needs a snapshot; the second call reuses the first one's memory with `copy_`
    x = torch.randn(64)
    with Tracer(Events(), fast=True) as tracer:
        for _ in range(2):
            h = x * 1
            F.silu(h, inplace=True)
            del h
            gc.collect()
        assert tracer.inplace_calls._pool  # the snapshot went back to the pool and was reused
        assert tracer.writes == 2  # the two silu_, not the copy into the reused snapshot


def test_a_tracer_whose_rules_read_neither_event_leaves_torch_level_calls_alone() -> None:
    from torch.overrides import _get_current_function_mode_stack

    with Tracer(Wants(HeldTensorUsed), fast=True) as tracer:
        assert tracer.inplace_calls.suspects is None
        assert _get_current_function_mode_stack() == []


@torch.jit.script
def _scripted_double(a: torch.Tensor) -> torch.Tensor:
    return a * 2


class _Triple(nn.Module):
    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return a * 3


def test_a_read_inside_torchscript_is_the_deep_tracers_read_in_fast_mode_too() -> None:
    import inplace_doctor as ipd

    scripted_module = torch.jit.script(_Triple())

    def found(deep: bool, reads: object) -> list[tuple[object, ...]]:
        torch.manual_seed(0)
        with ipd.watch(deep=deep, select=["IPD105"]) as session:
            h = torch.randn(8)
            out = F.relu(h, inplace=True)
            reads(h) + out  # type: ignore[operator]
        assert session.deep is deep
        return [(f.code, f.message) for f in session.findings]

    for reads in (_scripted_double, scripted_module):
        deep = found(True, reads)
        assert len(deep) == 1 and found(False, reads) == deep
    assert torch._C.ScriptFunction.__call__ is not None and "seen" not in torch._C.ScriptFunction.__call__.__name__
