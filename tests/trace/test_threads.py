"""Threads the watched code starts (issue 24, item 10): PyTorch's dispatch modes and saved-tensor
hooks are per thread, so such a thread runs unwatched; the report says so, and a `watch()`
entered in the thread reports to the session that started it."""

from __future__ import annotations

import threading
from typing import Any

import torch

import inplace_doctor as ipd
from inplace_doctor.trace.tracer import Tracer


def caught_inplace_error(out: dict[str, Any]) -> None:
    """The script's worker: an in-place error PyTorch raises, which the worker catches."""
    try:
        w = torch.randn(3, requires_grad=True)
        y = w.exp()
        y.add_(1)  # <thread write>
        y.sum().backward()
    except RuntimeError as e:
        out["caught"] = str(e)


def test_pytorch_fact_modes_and_saved_tensor_hooks_do_not_follow_into_a_new_thread() -> None:
    packed: list[str] = []
    seen: dict[str, int] = {}

    def in_thread() -> None:
        seen["modes"] = torch._C._len_torch_dispatch_stack()
        torch.randn(2, requires_grad=True).exp()  # saves its output: a pack hook here would see it

    with ipd.watch(deep=True), torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append("pack") or t, lambda t: t):
        assert torch._C._len_torch_dispatch_stack() >= 1
        t = threading.Thread(target=in_thread)
        t.start()
        t.join()
    assert seen["modes"] == 1  # the counting mode only: the tracer's is not there
    assert packed == []


def test_a_thread_that_catches_an_inplace_error_is_named_in_the_report() -> None:
    out: dict[str, Any] = {}
    with ipd.watch() as session:
        worker = threading.Thread(target=caught_inplace_error, args=(out,), name="worker")
        worker.start()
        worker.join()
    assert "modified by an inplace operation" in out["caught"]  # PyTorch raised, the thread caught it
    report = session.report()
    assert report.findings == []  # not seen: the note says why, rather than a clean bill
    [note] = [n for n in report.notes if "thread" in n]
    assert note.startswith("1 thread started while watched (`worker`) ran ")
    assert "PyTorch ops unwatched" in note and "enter `ipd.watch()` in the thread's function" in note


def test_a_watch_in_the_thread_reports_to_the_session_that_started_it() -> None:
    out: dict[str, Any] = {}

    def watched_worker() -> None:
        with ipd.watch() as inner:
            caught_inplace_error(out)
        out["inner"] = [f.code for f in inner.findings]

    with ipd.watch() as session:
        worker = threading.Thread(target=watched_worker)
        worker.start()
        worker.join()
    assert out["inner"] == ["IPD101"]
    assert [(f.code, f.mutation.line) for f in session.findings] == [("IPD101", _line("# <thread write>"))]
    assert not any("thread" in n for n in session.report().notes)  # it was watched, by its own session


def test_threads_that_run_no_torch_op_and_threads_started_after_the_watch_are_not_named() -> None:
    with ipd.watch() as session:
        idle = threading.Thread(target=lambda: None)
        idle.start()
        idle.join()
    out: dict[str, Any] = {}
    later = threading.Thread(target=caught_inplace_error, args=(out,))
    later.start()
    later.join()
    assert not any("thread" in n for n in session.report().notes)


def test_thread_start_and_the_thread_object_are_left_as_found() -> None:
    original = threading.Thread.start
    tracer = Tracer(lambda event: None)
    with tracer:
        assert threading.Thread.start is not original
        worker = threading.Thread(target=lambda: torch.ones(2).add_(1))
        worker.start()
        worker.join()
    assert threading.Thread.start is original
    assert "run" not in worker.__dict__
    assert [(t.name, t.ops > 0) for t in tracer.threads.threads] == [(worker.name, True)]


def _line(marker: str) -> int:
    from conftest import line_of

    return line_of(__file__, marker)


def test_ops_a_thread_runs_after_the_watch_ended_are_not_counted() -> None:
    go = threading.Event()
    out: dict[str, Any] = {}

    def late_worker() -> None:
        go.wait()
        caught_inplace_error(out)

    with ipd.watch() as session:
        worker = threading.Thread(target=late_worker)
        worker.start()
    go.set()
    worker.join()
    assert "caught" in out
    assert not any("thread" in n for n in session.report().notes)
    assert [t.ops for t in session.tracer.threads.threads] == [0]
