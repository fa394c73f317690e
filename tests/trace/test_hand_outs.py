"""IPD109's hand-outs under the fast tracer (issue 26): the Tensor methods wrapped while it runs.

The deep tracer sees `.numpy()`, `__dlpack__()`, `__array__()` and `.data_ptr()` through its
`TorchFunctionMode`; the fast one wraps those methods on `torch.Tensor` (trace/fast/hand_outs.py). Both
must see the same calls, and the fast one must leave `torch.Tensor` as it found it.
"""

from __future__ import annotations

import runpy
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _no_leftovers import Leftovers, leftovers, warm_up
from conftest import in_fresh_thread

import inplace_doctor as ipd
from inplace_doctor.rules import FAST_MODE_RULES
from inplace_doctor.trace.fast.hand_outs import METHODS


def _session(deep: bool, **kwargs: Any) -> ipd.watch:
    session = ipd.watch(deep=deep, select=sorted(FAST_MODE_RULES), **kwargs)
    assert session.deep is deep
    return session


def _hand_outs(session: ipd.watch) -> list[tuple[str, str]]:
    """(method, how) of each hand-out remembered, by storage."""
    return sorted((e.method, e.how) for entries in session.tracer.contents.by_storage.values() for e in entries)


def test_the_fast_tracer_puts_the_methods_back_as_it_found_them():
    before = {name: torch.Tensor.__dict__.get(name) for name in METHODS}
    with _session(deep=False):
        assert all(torch.Tensor.__dict__.get(name) is not before[name] for name in METHODS)
    assert {name: torch.Tensor.__dict__.get(name) for name in METHODS} == before
    assert "numpy" not in torch.Tensor.__dict__ and "data_ptr" not in torch.Tensor.__dict__  # inherited, as before


@pytest.mark.parametrize("deep", [True, False], ids=["deep", "fast"])
def test_np_asarray_is_one_hand_out_named_by_what_numpy_called(deep: bool):
    """`np.asarray(t)` calls `t.__array__()`, which calls `t.numpy()`: one hand-out, the outer call."""
    t = torch.randn(4)
    with _session(deep) as session:
        np.asarray(t)
        assert _hand_outs(session) == [("__array__", "`__array__()`")]


@pytest.mark.parametrize("deep", [True, False], ids=["deep", "fast"])
def test_hand_outs_in_another_thread_or_with_torch_functions_off_are_not_seen(deep: bool):
    t = torch.randn(4)
    with _session(deep) as session:
        worker = threading.Thread(target=lambda: (t.numpy(), t.data_ptr()))
        worker.start()
        worker.join()
        with torch._C.DisableTorchFunction():
            t.numpy()
        assert _hand_outs(session) == []
        t.data_ptr()
        assert _hand_outs(session) == [("data_ptr", "`.data_ptr()`")]



@pytest.mark.parametrize("deep", [True, False], ids=["deep", "fast"])
def test_nested_sessions_each_see_a_hand_out(deep: bool):
    t = torch.randn(4)
    with _session(deep) as outer, _session(deep) as inner:
        t.numpy()
        assert _hand_outs(inner) == _hand_outs(outer) == [("numpy", "`.numpy()`")]


def test_sessions_of_two_threads_may_end_in_any_order() -> None:
    """The wrappers are shared: the first session to end leaves them for the other's hand-outs, and
    the last puts torch's own back (the whole process as before: `_no_leftovers`)."""
    warm_up()  # what torch changes at its first use (importing torch._dynamo) is no leftover
    before, leftover = Leftovers.take(), {name: torch.Tensor.__dict__.get(name) for name in METHODS}
    started, first_ended = threading.Event(), threading.Event()
    seen: list[tuple[str, str]] = []

    def second() -> None:
        with _session(deep=False) as session:
            started.set()
            assert first_ended.wait(60)
            torch.randn(4).numpy()
            seen.extend(_hand_outs(session))

    worker = threading.Thread(target=second)
    with _session(deep=False):
        worker.start()
        assert started.wait(60)
    first_ended.set()
    worker.join(60)
    assert seen == [("numpy", "`.numpy()`")]
    assert {name: torch.Tensor.__dict__.get(name) for name in METHODS} == leftover
    found = leftovers(before)
    assert not found, "\n".join(found)


def _write_through_asarray(deep: bool) -> tuple[list[str], torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(6, requires_grad=True)
    with _session(deep) as session:
        s = torch.sigmoid(x)
        view = np.asarray(s.detach())
        view *= 0.5  # no op, no version bump
        s.sum().backward()
    return [f.message for f in session.findings], x.grad


def test_a_write_through_np_asarray_is_the_same_finding_in_both_tracers():
    deep_found, deep_grad = _write_through_asarray(True)
    fast_found, fast_grad = _write_through_asarray(False)
    assert len(deep_found) == 1 and "`__array__()`" in deep_found[0]
    assert fast_found == deep_found
    assert torch.equal(fast_grad, deep_grad)  # the tool changes nothing the program computes


def test_with_nothing_handed_out_no_saved_tensor_is_fingerprinted():
    """The fast tracer's pack hook pays nothing for IPD109 until memory is handed out."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    with _session(deep=False) as session:
        out = model(torch.randn(4, 8))
        records = [ref() for bucket in session.tracer._saved.by_storage.values() for ref in bucket.values()]
        assert records and all(r is not None and r.fingerprint is None for r in records)
        out.sum().backward()
    assert session.findings == []


BUG_REPORTS = Path(__file__).resolve().parents[1] / "real_code" / "bug_reports"


def _findings_of(path: Path, deep: bool, check_contents: bool) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
    session = _session(deep, check_contents=check_contents)
    with session:
        result = runpy.run_path(str(path), run_name="__main__")["result"]
    found = sorted(
        (f.code, str(f.severity), f.mutation.line, f.saved.line if f.saved else None, f.confirmed, f.message)
        for f in session.findings
    )
    return found, result


@pytest.mark.parametrize("check_contents", [False, True], ids=["hand-outs", "check_contents"])
def test_a_real_bug_report_gives_the_same_findings_and_results_in_both_tracers(check_contents: bool):
    """pytorch/pytorch#97586 (NumPy clips the probabilities sigmoid saved, through `.numpy()`), two
    SGD steps: the same IPD109 findings (with `check_contents`, the writing line in the helper),
    and parameters bit-identical to a run without the tool."""
    path = BUG_REPORTS / "numpy_clip_saved_probs.py"
    deep_found, _ = in_fresh_thread(_findings_of, path, True, check_contents)
    fast_found, fast_result = in_fresh_thread(_findings_of, path, False, check_contents)
    plain = in_fresh_thread(runpy.run_path, str(path), run_name="__main__")["result"]
    assert deep_found and {f[0] for f in deep_found} == {"IPD109"}
    assert fast_found == deep_found
    assert fast_result.keys() == plain.keys() and all(torch.equal(fast_result[k], plain[k]) for k in plain)
