"""IPD109: saved tensors written outside PyTorch (NumPy, DLPack, pointers), found by their bytes.

Real torch and NumPy, no mocks: each case is a small program run under `ipd.watch()` (or the
`run` command), and the finding's lines are read from the program's own markers.
"""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import inplace_doctor as ipd
from inplace_doctor import Severity
from inplace_doctor.rules import FAST_MODE_RULES
from inplace_doctor.trace.saves.fingerprint import fingerprint

HERE = Path(__file__).resolve()
#: the fast tracer runs only when every selected rule is one it serves
FAST_ONLY = {"select": sorted(FAST_MODE_RULES)}


@pytest.fixture(params=[True, False], ids=["deep", "fast"])
def deep(request: pytest.FixtureRequest) -> bool:
    """Each case under both tracers (issue 26): the fast one must find what the deep one finds."""
    return bool(request.param)


def _watch(deep: bool, *models: torch.nn.Module, **kwargs: Any) -> ipd.watch:
    session = ipd.watch(*models, deep=deep, **({} if deep else FAST_ONLY), **kwargs)
    assert session.deep is deep  # `check_contents` no longer turns deep mode on
    return session


def _audit(deep: bool, *args: Any, **kwargs: Any) -> ipd.Report:
    report = ipd.audit(*args, deep=deep, **({} if deep else FAST_ONLY), **kwargs)
    assert ("fast_tracer" in report.stats) is not deep
    return report


def _line(marker: str) -> int:
    """The line of this file holding `marker` in a comment."""
    [number] = [i for i, text in enumerate(HERE.read_text().splitlines(), 1) if text.endswith(f"# {marker}")]
    return number


def _ipd109(session: ipd.watch) -> list[ipd.Finding]:
    return [f for f in session.findings if f.code == "IPD109"]


def test_numpy_write_to_a_saved_activation_names_saving_hand_out_and_write_lines_with_check_contents(deep):
    x = torch.randn(8, requires_grad=True)
    with _watch(deep, check_contents=True) as session:
        s = torch.sigmoid(x)  # saves-s
        a = s.detach().numpy()  # hands-out-s
        a *= 0.5  # writes-s
        s.sum().backward()
    [finding] = _ipd109(session)
    assert finding.confirmed and finding.severity is Severity.ERROR
    assert finding.saved is not None and finding.saved.line == _line("saves-s")
    assert finding.mutation.line == _line("writes-s") and HERE.samefile(finding.mutation.file)
    assert finding.facts.handed_out.endswith(f"test_content_checks.py:{_line('hands-out-s')}")
    assert f"test_content_checks.py:{_line('hands-out-s')}" in finding.message
    assert "`a *= 0.5`" in finding.message and "SigmoidBackward0" in finding.message


def test_without_the_option_the_hand_out_line_stands_for_the_write(deep):
    x = torch.randn(8, requires_grad=True)
    with _watch(deep) as session:
        s = torch.sigmoid(x)
        a = s.detach().numpy()  # default-hand-out
        a[0] = 0.0
        s.sum().backward()
    [finding] = _ipd109(session)
    assert finding.confirmed and finding.mutation.line == _line("default-hand-out")
    assert "check_contents=True" in finding.message


def test_hand_out_before_the_save_is_seen_too(deep):
    x = torch.randn(4, 4, requires_grad=True)
    buffer = torch.empty(4, 4)
    with _watch(deep) as session:
        view = buffer.numpy()  # handed out first
        buffer.copy_(x.detach())
        y = torch.mm(x, buffer)  # saves-buffer
        np.copyto(view, np.ones((4, 4), dtype=np.float32))
        y.sum().backward()
    [finding] = _ipd109(session)
    assert finding.confirmed and finding.saved.line == _line("saves-buffer")
    assert finding.facts.how == "`.numpy()`"


def test_dlpack_and_data_ptr_hand_outs(deep):
    x = torch.randn(6, requires_grad=True)
    with _watch(deep, check_contents=True) as session:
        t = torch.tanh(x)
        view = np.from_dlpack(t.detach())
        np.clip(view, -0.1, 0.1, out=view)  # dlpack-write
        e = torch.exp(x)
        pointer = e.data_ptr()
        ctypes.memset(pointer, 0, 4)  # pointer-write
        (t.sum() + e.sum()).backward()
    by_how = {f.facts.how: f for f in _ipd109(session)}
    assert set(by_how) == {"`__dlpack__()`", "`.data_ptr()`"}
    assert by_how["`__dlpack__()`"].mutation.line == _line("dlpack-write")
    assert by_how["`.data_ptr()`"].mutation.line == _line("pointer-write")
    assert all(f.confirmed for f in by_how.values())


def test_to_dlpack_is_a_hand_out(deep):
    x = torch.randn(5, requires_grad=True)
    with _watch(deep) as session:
        s = torch.sigmoid(x)
        capsule = torch.utils.dlpack.to_dlpack(s.detach())  # to-dlpack
        with torch._C.DisableTorchFunction():
            pointer = s.data_ptr()  # the consumer's own pointer into the capsule's memory, unseen
        ctypes.memset(pointer, 0, 4)
        s.sum().backward()
    [finding] = _ipd109(session)
    assert finding.facts.how == "`to_dlpack()`" and finding.mutation.line == _line("to-dlpack")
    del capsule


def test_a_write_with_no_hand_out_is_found_only_with_check_contents(deep):
    """An extension kernel writing an input it does not declare: simulated by a pointer taken
    before the session (no hand-out seen), written inside it."""
    for check in (False, True):
        x = torch.randn(8, requires_grad=True)
        with _watch(deep, check_contents=check) as session:
            s = torch.sigmoid(x)
            with torch._C.DisableTorchFunction():
                pointer = s.data_ptr()  # not a hand-out the tool sees: like a C++ kernel's
            ctypes.memset(pointer, 0, 8)
            s.sum().backward()
        found = _ipd109(session)
        assert len(found) == check, found
    assert "no hand-out of its memory seen" in found[0].message and found[0].confirmed


def test_a_change_never_backpropagated_is_info_and_a_freed_graph_is_nothing(deep):
    x = torch.randn(8, requires_grad=True)
    with _watch(deep) as session:
        s = torch.sigmoid(x)
        a = s.detach().numpy()
        a *= 0.5
    [finding] = _ipd109(session)
    assert finding.severity is Severity.INFO and not finding.confirmed
    with _watch(deep) as session:
        s = torch.sigmoid(x)
        a = s.detach().numpy()
        a *= 0.5
        del s, a
    assert _ipd109(session) == []


@pytest.mark.parametrize("check", [False, True])
def test_reads_dispatcher_writes_and_writes_after_backward_are_not_ipd109(check, deep):
    x = torch.randn(8, requires_grad=True)
    with _watch(deep, check_contents=check) as session:
        s = torch.sigmoid(x)
        mean = float(s.detach().numpy().mean())  # read only
        s.sum().backward()
        a = s.detach().numpy()
        a *= 0.5  # after backward: nothing read it since
        e = torch.exp(x)
        e.data.mul_(2)  # IPD104's case, not this rule's
        e.sum().backward()
    assert mean > 0
    assert [f.code for f in session.findings] == ["IPD104"]


def test_nan_payloads_compare_by_bytes():
    t = torch.tensor([float("nan"), 1.0, -0.0])
    other = t.clone()
    other.view(torch.int32)[0] += 1  # another NaN
    assert torch.isnan(other[0]) and fingerprint(t) != fingerprint(other)
    assert fingerprint(t) == fingerprint(t.clone())
    zero = t.clone()
    zero[2] = 0.0
    assert fingerprint(zero) != fingerprint(t)  # -0.0 == 0.0 by value, not by bytes
    swapped = torch.randn(64, 1024)
    before = fingerprint(swapped)
    swapped[0, [0, 1]] = swapped[0, [1, 0]].clone()
    assert fingerprint(swapped) != before


def test_check_contents_changes_nothing_the_program_computes_and_keeps_nothing_alive(deep):
    def step(watched: bool):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Flatten(),
            torch.nn.Linear(4 * 6 * 6, 3), torch.nn.Sigmoid(),
        )
        x = torch.randn(2, 3, 8, 8)
        session = _watch(deep, model, check_contents=True) if watched else None
        refs = []
        if session is not None:
            session.__enter__()
        try:
            out = model(x)
            logged = out.detach().numpy().copy()  # a hand-out, only read
            refs.append(weakref.ref(out))
            out.sum().backward()
        finally:
            if session is not None:
                session.__exit__(None, None, None)
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        result = out.detach().clone()
        del out
        gc.collect()
        alive = [r() for r in refs if r() is not None]
        assert not alive, (watched, [(list(o.keys())[:8], [type(p).__name__ for p in gc.get_referrers(o)]) for a in alive for o in gc.get_referrers(a) if isinstance(o, dict)])
        if session is not None:
            assert session.findings == []
            assert session.tracer.live_saved_tensors() == 0
        return result, grads, logged

    plain, watched = step(False), step(True)
    assert torch.equal(plain[0], watched[0]) and np.array_equal(plain[2], watched[2])
    assert plain[1].keys() == watched[1].keys()
    assert all(torch.equal(plain[1][k], watched[1][k]) for k in plain[1])


def test_line_checks_leave_no_trace_function_behind(deep):
    x = torch.randn(8, requires_grad=True)
    with _watch(deep, check_contents=True):
        s = torch.sigmoid(x)
        a = s.detach().numpy()
        a *= 0.5
    assert sys.gettrace() is None or "coverage" in type(sys.gettrace()).__module__


def test_run_check_contents_names_the_three_lines(tmp_path: Path, deep):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        x = torch.randn(8, requires_grad=True)
        s = torch.sigmoid(x)
        a = s.detach().numpy()
        a *= 0.5
        s.sum().backward()
        print("grad", float(x.grad.sum()))
    """).lstrip())
    src = str(Path(ipd.__file__).resolve().parents[1])
    mode = ["--deep"] if deep else ["--fast", "--select", ",".join(sorted(FAST_MODE_RULES))]
    done = subprocess.run(
        [sys.executable, "-m", "inplace_doctor", "run", "--check-contents", *mode, str(script)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": src},
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("grad ")
    assert "IPD109" in done.stderr
    assert "train.py:5" in done.stderr and "a *= 0.5" in done.stderr  # the write
    assert "train.py:3" in done.stderr  # the save
    assert "train.py:4" in done.stderr  # the hand-out, in the fix


class _PlotsItsActivation(torch.nn.Module):
    """A model that rescales its sigmoid activation through NumPy for a plot, inside forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.sigmoid(self.fc(x))  # model-saves
        shown = h.detach().numpy()  # model-hands-out
        shown *= 255.0  # model-writes
        return h


@pytest.mark.parametrize("check", [False, True])
def test_audit_reports_a_numpy_write_inside_forward(check, deep):
    report = _audit(deep, _PlotsItsActivation(), torch.randn(2, 4), check_contents=check)
    [finding] = [f for f in report.findings if f.code == "IPD109"]
    assert finding.confirmed and finding.saved.line == _line("model-saves")
    # without check_contents, audit runs the model a second time to find the line (its note says so)
    assert finding.mutation.line == _line("model-writes")
    assert any("ran a second time" in note for note in report.notes) is (not check)


def test_torchs_own_pointer_comparisons_are_not_hand_outs_and_repeats_are_remembered_once(deep):
    lstm = torch.nn.LSTM(4, 4)  # RNNBase compares its weights' data_ptr() on every forward
    weight = torch.randn(16, requires_grad=True)
    with _watch(deep) as session:
        lstm(torch.randn(3, 1, 4))[0].sum().backward()
        assert session.tracer.contents.by_storage == {}
        for _ in range(20):
            weight.detach().numpy()
        [entries] = session.tracer.contents.by_storage.values()
        assert len(entries) == 1


def test_audit_without_backward_predicts_the_change(deep):
    report = _audit(deep, _PlotsItsActivation(), torch.randn(2, 4), backward=False)
    [finding] = [f for f in report.findings if f.code == "IPD109"]
    assert not finding.confirmed and finding.severity is Severity.WARNING


class _WritesOnce(torch.nn.Module):
    """Writes its activation through NumPy on its first call only: a second run does not repeat it."""

    def __init__(self, shift_each_call: bool) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.calls = 0
        self.shift_each_call = shift_each_call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        shift = float(self.calls) if self.shift_each_call else 0.0
        h = torch.sigmoid(self.fc(x) + shift)
        shown = h.detach().numpy()  # once-hands-out
        if self.calls == 1 or self.shift_each_call:
            shown *= 255.0
        return h


@pytest.mark.parametrize("shift_each_call, reason", [(False, "no line of your code changed them"), (True, "not deterministic")])
def test_audit_says_why_a_second_run_did_not_name_the_line(shift_each_call, reason, deep):
    """State outside parameters, buffers and RNG (a call counter) makes the second run differ: the
    finding keeps the hand-out line and says which way the run did not repeat."""
    model = _WritesOnce(shift_each_call)
    report = _audit(deep, model, torch.randn(2, 4))
    [finding] = [f for f in report.findings if f.code == "IPD109"]
    assert finding.confirmed and finding.mutation.line == _line("once-hands-out")
    assert reason in finding.what
    assert model.calls == 2  # the model ran twice, and the report says so
    assert any("ran a second time" in note for note in report.notes)


def test_audit_without_an_outside_write_runs_the_model_once(deep):
    model = _WritesOnce(shift_each_call=False)
    model.calls = 1  # past its first call: it no longer writes
    report = _audit(deep, model, torch.randn(2, 4))
    assert not [f for f in report.findings if f.code == "IPD109"] and model.calls == 2
    assert not any("ran a second time" in note for note in report.notes)


def test_the_search_leaves_no_trace_function_and_keeps_nothing_alive(deep):
    def records() -> set[int]:
        gc.collect()
        return {id(o) for o in gc.get_objects() if type(o).__name__ == "SavedRecord"}

    model = _PlotsItsActivation()
    x = torch.randn(2, 4)
    tracing = sys.gettrace()
    before = records()  # other tests' graphs may still hold theirs
    report = _audit(deep, model, x)
    assert sys.gettrace() is tracing
    assert records() - before == set()
    assert [f.code for f in report.findings] == ["IPD109"]


def _halve(values: np.ndarray) -> None:
    values *= 0.5  # helper-writes


def test_check_contents_names_the_line_in_a_user_function_the_hand_out_frame_calls_in_every_step(deep):
    """The write is in a helper the hand-out's frame calls; in the second step a new hand-out comes
    while the checks still follow the first one's caller: each step names the helper's line."""
    lin = torch.nn.Linear(4, 4)

    def forward(x: torch.Tensor) -> torch.Tensor:
        h = torch.sigmoid(lin(x))
        _halve(h.detach().numpy())
        return h

    with _watch(deep, check_contents=True) as session:
        for _ in range(2):
            forward(torch.randn(2, 4)).sum().backward()
    findings = _ipd109(session)
    assert findings and all(f.confirmed for f in findings)
    assert {(f.mutation.line, f.mutation.stack[-1].function) for f in findings} == {(_line("helper-writes"), "_halve")}
    assert sum(f.count for f in findings) == 2


def _busy(n: int) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


def test_lines_in_called_functions_do_not_spend_the_hand_out_frames_budget(deep):
    """A long user function between the hand-out and the write: its lines have their own budget
    (past it, it runs unchecked), and the write after it in the hand-out's frame is still named."""
    x = torch.randn(8, requires_grad=True)
    with _watch(deep, check_contents=True) as session:
        s = torch.sigmoid(x)
        a = s.detach().numpy()
        _busy(5000)
        a *= 0.5  # after-busy-writes
        s.sum().backward()
    [finding] = _ipd109(session)
    assert finding.mutation.line == _line("after-busy-writes")


class _ZeroesThroughAStoragePointer(torch.nn.Module):
    """Stands for an extension kernel: writes its activation through a storage's raw pointer, a
    path no hand-out call sees."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.sigmoid(self.fc(x))  # pointer-saves
        pointer = h.untyped_storage().data_ptr()
        ctypes.memset(pointer, 0, 4)  # pointer-writes
        return h


def test_audit_with_check_contents_names_a_write_no_hand_out_saw(deep):
    report = _audit(deep, _ZeroesThroughAStoragePointer(), torch.randn(2, 4), check_contents=True)
    [finding] = [f for f in report.findings if f.code == "IPD109"]
    assert finding.confirmed and finding.saved.line == _line("pointer-saves")
    assert finding.mutation.line == _line("pointer-writes") and HERE.samefile(finding.mutation.file)
    assert finding.facts.handed_out is None
    assert f"test_content_checks.py:{_line('pointer-writes')}" in finding.fix
