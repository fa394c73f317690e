"""A write to a saved tensor is a prediction until backward reaches it (issue 13's reproductions).

PyTorch raises (IPD101) or silently reads changed values (IPD104) only when a
backward reaches the overwritten saved tensor. A graph freed without that is
harmless: nothing is reported, the report's statistics count it. Both of the
issue's reproductions run here as written, under `watch()` and under
`inplace-doctor run`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from conftest import line_of
from torch import nn

import inplace_doctor as ipd
from inplace_doctor import Severity
from inplace_doctor.causes import Unreached

MINIMAL = """
import torch
torch.manual_seed(0)
pi = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
opt = torch.optim.Adam(pi.parameters())
for _ in range(ITERATIONS):
    loss = pi(torch.randn(8, 4)).pow(2).mean()
    next_action = pi(torch.randn(8, 4))    # graph kept alive, never backpropagated
    target = next_action.detach().sum(1)
    opt.zero_grad(); loss.backward(); opt.step()
"""

SOFT_UPDATE = """
import copy
import torch
torch.manual_seed(0)
q = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
q_target = copy.deepcopy(q)
opt = torch.optim.SGD(q.parameters(), lr=0.1)
for _ in range(3):
    obs, next_obs = torch.randn(8, 4), torch.randn(8, 4)
    next_q = q_target(next_obs)                  # built with grad, used detached
    y = 1.0 + 0.99 * next_q.detach()
    loss = (q(obs) - y).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    with torch.no_grad():
        for tp, p in zip(q_target.parameters(), q.parameters()):
            tp.data.copy_(0.99 * tp.data + 0.01 * p.data)
"""


def serious(findings: list[ipd.Finding]) -> list[ipd.Finding]:
    return [f for f in findings if f.severity is not Severity.INFO]


def run_cli(script: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inplace_doctor", "run", *options, str(script)],
        capture_output=True, text=True, timeout=300, env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin"},
    )


def test_the_minimal_reproduction_has_no_error_or_warning():
    namespace: dict = {}
    with ipd.watch() as session:
        exec(MINIMAL.replace("ITERATIONS", "1"), namespace)
    assert serious(session.findings) == []
    # The graph was still alive when watch() ended: a prediction nothing confirmed, said as info.
    (info,) = session.report().findings
    assert info.code == "IPD101" and info.severity is Severity.INFO and info.confirmed is False
    assert info.unreached is Unreached.NOT_REACHED_IN_WATCH


def test_a_loop_drops_each_freed_graph_and_counts_it():
    with ipd.watch() as session:
        exec(MINIMAL.replace("ITERATIONS", "3"), {})
    report = session.report()
    assert serious(report.findings) == []
    assert report.stats["predictions_dropped"] >= 2  # the first two next_action graphs, freed by rebinding
    assert any("freed without a backward" in note for note in report.notes)


def test_the_soft_update_through_data_has_no_error_or_warning():
    with ipd.watch() as session:
        exec(SOFT_UPDATE, {})
    assert serious(session.findings) == []


def test_both_reproductions_exit_0_under_run(tmp_path: Path):
    for name, source in (("minimal.py", MINIMAL.replace("ITERATIONS", "3")), ("soft.py", SOFT_UPDATE)):
        script = tmp_path / name
        script.write_text(source)
        done = run_cli(script, "--fail-fast")  # fail-fast too: a graph freed unread never stops a program
        assert done.returncode == 0, done.stderr
        assert not re.search(r"^(error|warning)\s", done.stderr, re.M), done.stderr


def test_the_same_write_is_an_error_when_a_backward_does_reach_it():
    torch.manual_seed(0)
    pi = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = torch.optim.Adam(pi.parameters())
    try:
        with ipd.watch(pi=pi) as session:
            loss = pi(torch.randn(8, 4)).pow(2).mean()
            second = pi(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            second.backward()  # reaches the weights the step overwrote
    except ipd.InplaceError:
        pass
    (f,) = session.findings
    assert f.code == "IPD101" and f.severity is Severity.ERROR and f.confirmed is True
    assert set(f.places) <= {"pi.0.weight", "pi.2.weight"} and f.places


def test_audit_reports_what_backward_did_not_reach_after_an_earlier_error_as_a_warning():
    class TwoBugs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.sigmoid(self.a(x))
            h.mul_(2)  # reached second: backward stops at the other one first
            g = torch.tanh(self.b(h))
            return g.add_(1)

    report = ipd.audit(TwoBugs(), torch.randn(2, 4))
    by_line = sorted(report.findings, key=lambda f: f.mutation.line)
    assert [(f.code, f.severity, f.confirmed) for f in by_line] == [
        ("IPD101", Severity.WARNING, False),
        ("IPD101", Severity.ERROR, True),
    ]
    assert by_line[0].unreached is Unreached.STOPPED_AT_INPLACE_ERROR


def test_an_ipd104_prediction_is_confirmed_when_backward_reads_the_changed_values():
    with ipd.watch() as session:
        x = torch.randn(4, requires_grad=True)
        s = torch.sigmoid(x)
        s.data.mul_(0.5)
        s.sum().backward()
    (f,) = session.findings
    assert f.code == "IPD104" and f.confirmed is True and f.severity is Severity.ERROR
    assert "backward read the new values" in f.why


def test_an_ipd104_write_to_a_graph_that_is_freed_is_dropped():
    with ipd.watch() as session:
        x = torch.randn(4, requires_grad=True)
        s = torch.sigmoid(x)
        s.data.mul_(0.5)
        x.sum()  # the next op settles the write: a prediction on the saved output
        del s  # frees the graph: nothing will ever read it
    assert session.findings == [] and session.report().stats["predictions_dropped"] == 1


def test_lstm_cell_float64_composite_kernel_is_clean():
    # LSTMCell on CPU in float64 runs ATen's composite cell: `unsafe_chunk` gates (no shared version
    # counter, interleaved in one storage) and in-place sigmoid_/tanh_ on each. They share a byte
    # range but no element: nothing is overwritten.
    cell = nn.LSTMCell(4, 8).double()
    with ipd.watch(cell) as session:
        h, c = cell(torch.randn(3, 4, dtype=torch.float64))
        (h.sum() + c.sum()).backward()
    assert session.findings == []


def test_a_tensor_subclass_built_from_a_fresh_tensor_works_under_watch():
    class Distribution(torch.Tensor):
        pass

    with ipd.watch():
        d = Distribution(torch.randn(3))
    assert type(d) is Distribution
    assert "__new__" not in torch.Tensor.__dict__  # undone on exit


def test_a_deprecation_wrapper_is_never_the_users_line(tmp_path: Path):
    script = tmp_path / "wn.py"
    script.write_text(textwrap.dedent("""
        import warnings
        import torch
        import inplace_doctor as ipd
        warnings.simplefilter("ignore")
        with ipd.watch() as session:
            lin = torch.nn.utils.weight_norm(torch.nn.Linear(4, 4))
            x = torch.randn(2, 4, requires_grad=True)
            y = lin(x)
            with torch.no_grad():
                lin.weight_v.mul_(2)
            try:
                y.sum().backward()
            except RuntimeError:
                pass
        (f,) = session.findings
        print(f.saved.file, f.saved.line, f.mutation.line)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    file, saved_line, write_line = done.stdout.split()
    assert file == str(script) and (int(saved_line), int(write_line)) == (9, 11)


def test_audit_names_models_inside_the_one_audited():
    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.g = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
            self.d = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid(), nn.ReLU(inplace=True))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.d(self.g(x))

    pair = Pair()
    report = ipd.audit(pair, torch.randn(2, 4), names={"G": pair.g, "D": pair.d, "gan": pair})
    (f,) = report.findings
    assert f.mutation.module == "D.2" and f.places == ("D.2",)
    assert "`D.2.inplace = False`" in f.fix
    assert ipd.audit(pair, torch.randn(2, 4)).findings[0].mutation.module == "d.2"  # unnamed: relative paths


def test_models_are_named_by_the_variables_that_hold_them_and_never_share_a_path():
    G = nn.Sequential(nn.Linear(2, 2))
    D = nn.Sequential(nn.Linear(2, 2))
    paths = {known.path for known in ipd.watch(G, D).tracer.modules._known.values()}
    assert {"G", "G.0", "D", "D.0"} <= paths
    twins = [nn.Sequential(nn.Linear(2, 2), nn.Sigmoid(), nn.ReLU(inplace=True)) for _ in range(2)]
    with ipd.watch() as session:
        kept = [m(torch.randn(1, 2)) for m in twins]  # the loop variable names neither: the list does
    (f,) = session.findings
    assert f.count == 2 and set(f.places) == {"twins[0].2", "twins[1].2"} and kept


class _TwoBugs(nn.Module):
    """Two overwritten saved tensors on one path: backward stops at the one nearer the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.sigmoid(self.a(x))
        h.mul_(2)  # reached second: backward stops at the other one first
        g = torch.tanh(self.b(h))
        return g.add_(1)


def test_watch_reports_what_a_stopped_backward_did_not_reach_as_a_warning_when_the_error_was_caught():
    """One policy whatever ended the run: here the program catches the error and `watch()` exits
    normally (as `inplace-doctor run` closes the session after a script's error)."""
    torch.manual_seed(0)
    model = _TwoBugs()
    with ipd.watch() as session:
        out = model(torch.randn(2, 4))
        with contextlib.suppress(RuntimeError):
            out.sum().backward()
    by_line = sorted(session.findings, key=lambda f: f.mutation.line)
    assert [(f.code, f.severity, f.confirmed) for f in by_line] == [
        ("IPD101", Severity.WARNING, False),
        ("IPD101", Severity.ERROR, True),
    ]
    assert by_line[0].unreached is Unreached.STOPPED_AT_INPLACE_ERROR


def test_a_prediction_made_after_the_stopped_backward_keeps_its_own_reason():
    torch.manual_seed(0)
    model, other = _TwoBugs(), nn.Linear(4, 4)
    with ipd.watch() as session:
        out = model(torch.randn(2, 4))
        with contextlib.suppress(RuntimeError):
            out.sum().backward()
        later = torch.sigmoid(other(torch.randn(2, 4)))
        later.mul_(2)  # <never backpropagated>
        session.tracer.flush()
    (f,) = [f for f in session.findings if f.mutation.line == line_of(__file__, "# <never backpropagated>")]
    assert f.severity is Severity.INFO and f.unreached is Unreached.NOT_REACHED_IN_WATCH
    del later


def test_run_reports_what_the_script_s_stopped_backward_did_not_reach_as_a_warning(tmp_path: Path):
    script = tmp_path / "two_bugs.py"
    script.write_text(textwrap.dedent("""
        import torch
        torch.manual_seed(0)
        a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        h = torch.sigmoid(a(torch.randn(2, 4)))
        h.mul_(2)
        g = torch.tanh(b(h))
        g.add_(1)
        g.sum().backward()
    """))
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "inplace_doctor", "run", "--format", "json", "--output", str(report), str(script)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"},
    )
    assert done.returncode == 1, done.stderr
    findings = sorted(json.loads(report.read_text())["findings"], key=lambda f: f["mutation"]["line"])
    assert [(f["code"], f["severity"], f["confirmed"]) for f in findings] == [
        ("IPD101", "warning", False),
        ("IPD101", "error", True),
    ]
    assert findings[0]["unreached"] == "stopped-at-inplace-error"


class _FailsInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        raise ValueError("this backward is broken")


def test_a_backward_that_raised_another_error_leaves_what_it_did_not_reach_a_warning():
    torch.manual_seed(0)
    a = nn.Linear(4, 4)
    try:
        with ipd.watch() as session:
            h = torch.sigmoid(a(torch.randn(2, 4)))
            h.mul_(2)  # <behind the broken backward>
            _FailsInBackward.apply(h).sum().backward()
    except ValueError:
        pass
    (f,) = session.findings
    assert f.mutation.line == line_of(__file__, "# <behind the broken backward>")
    assert (f.code, f.severity, f.confirmed) == ("IPD101", Severity.WARNING, False)
    assert f.unreached is Unreached.STOPPED_AT_ERROR
