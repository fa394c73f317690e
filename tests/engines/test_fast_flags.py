"""The fast tracer asked for from `audit(deep=False)`, `inplace-doctor audit --fast` and
`inplace-doctor run --fast` (issue 26), and what its node-creation hook still records.

`--deep` is the default; `--fast` runs the fast tracer when every selected rule is one it
serves (`FAST_MODE_RULES`), else deep mode with a note saying so.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import line_of
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.cli.main import main
from inplace_doctor.errors import InplaceError
from inplace_doctor.examples import SigmoidThenReLU
from inplace_doctor.rules import FAST_MODE_RULES
from inplace_doctor.trace.fast.write_kernels import end_linger, registered

FAST = ",".join(sorted(FAST_MODE_RULES))
SOURCE = __file__


def _findings(report: ipd.Report) -> list[tuple[str, int | None, int | None]]:
    return [(f.code, f.mutation.line, f.saved.line if f.saved else None) for f in report.findings]


def test_audit_deep_false_finds_what_deep_mode_finds_with_the_fast_tracer() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    deep = ipd.audit(SigmoidThenReLU(), x, select=sorted(FAST_MODE_RULES), deep=True)
    fast = ipd.audit(SigmoidThenReLU(), x, select=sorted(FAST_MODE_RULES), deep=False)
    assert _findings(fast) == _findings(deep) and [f.code for f in fast.findings] == ["IPD101"]
    assert fast.stats["fast_tracer"] == 1 and "fast_tracer" not in deep.stats
    assert "ops" not in fast.stats and deep.stats["ops"] > fast.stats["writes"]  # the fast tracer sees only writes
    end_linger()  # they linger a second after the audit (trace/process/kernel_registration.py)
    assert registered() == 0  # then the kernels are gone


def test_audit_deep_false_with_a_rule_the_fast_tracer_does_not_serve_runs_deep_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from inplace_doctor.rules import registry

    monkeypatch.setitem(registry.RULES, "IPD105", replace(registry.RULES["IPD105"], fast=False))
    report = ipd.audit(SigmoidThenReLU(), torch.randn(4, 8), deep=False)
    assert "fast_tracer" not in report.stats
    [note] = [n for n in report.notes if "asked for the fast tracer" in n]
    assert note.startswith("audit(deep=False) asked for the fast tracer, but it ran in deep mode")
    assert "because IPD105 needs it" in note


def test_the_cli_audit_fast_flag_runs_the_fast_tracer(capsys: pytest.CaptureFixture[str]) -> None:
    spec = ["inplace_doctor.examples:SigmoidThenReLU", "--input", "4x8", "--select", FAST, "--format", "json"]
    assert main(["audit", *spec, "--fast", "--fail-on", "never"]) == 0
    fast = json.loads(capsys.readouterr().out)
    assert main(["audit", *spec, "--deep", "--fail-on", "never"]) == 0
    deep = json.loads(capsys.readouterr().out)
    assert fast["stats"]["fast_tracer"] == 1 and "fast_tracer" not in deep["stats"]
    assert [f["code"] for f in fast["findings"]] == [f["code"] for f in deep["findings"]] == ["IPD101"]


def test_fast_and_deep_flags_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "inplace_doctor.examples:SigmoidThenReLU", "--fast", "--deep"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


SCRIPT = textwrap.dedent("""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Sigmoid())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        h = model(torch.randn(2, 4))
        h.mul_(2)  # <overwrite>
        try:
            h.sum().backward()
        except RuntimeError as e:
            print("raised", type(e).__name__)
        opt.step()
        opt.zero_grad()
""")


def test_the_cli_run_fast_flag_finds_the_overwrite_with_the_fast_tracer(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    report = tmp_path / "report.json"
    status = main(["run", "--fast", "--select", FAST, "--format", "json", "--output", str(report), str(script)])
    assert status == 1  # an error finding: exit 1 at the default --fail-on
    found = json.loads(report.read_text())
    assert found["stats"]["fast_tracer"] == 1
    assert {f["code"] for f in found["findings"]} == {"IPD101"}
    assert {f["mutation"]["line"] for f in found["findings"]} == {line_of(SCRIPT, "# <overwrite>")}
    end_linger()
    assert registered() == 0


class Doubles(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise ValueError("custom backward failed on purpose")


class UsesDoubles(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = torch.sigmoid(self.fc(x))  # <sigmoid>
        return Doubles.apply(y)  # <custom apply>


def test_the_fast_tracer_names_the_forward_line_of_a_failing_custom_backward() -> None:
    """The node-creation hook reuses the stack its node's saves captured: still the apply line."""
    model = UsesDoubles()
    with pytest.raises(ValueError) as info, ipd.watch(model, deep=False, select=sorted(FAST_MODE_RULES)) as session:
        assert not session.deep
        model(torch.randn(3, 4)).sum().backward()
    [note] = info.value.__notes__
    assert "in DoublesBackward, the backward of `Doubles.apply` in model (UsesDoubles) at " in note
    assert f":{line_of(SOURCE, '# <custom apply>')}" in note


def test_the_fast_tracer_names_saved_tensors_after_sharing_stacks_with_their_nodes() -> None:
    model = UsesDoubles()
    with pytest.raises(InplaceError) as info, ipd.watch(model, deep=False, select=sorted(FAST_MODE_RULES)):
        y = torch.sigmoid(model.fc(torch.randn(3, 4)))  # <own sigmoid>
        y.add_(1)  # <write>
        y.sum().backward()
    [finding] = info.value.findings
    assert finding.code == "IPD101" and finding.saved is not None
    assert finding.saved.line == line_of(SOURCE, "# <own sigmoid>")
    assert finding.mutation.line == line_of(SOURCE, "# <write>")


def test_a_training_callback_window_registers_the_kernels_once_for_all_its_steps() -> None:
    """`deep=False` on the callbacks' window: one registration when it opens, kept over every
    step (the same library object), removed when it closes; the steps find what deep mode finds."""
    from inplace_doctor.integrations.window import StepWindow
    from inplace_doctor.trace.fast import write_kernels

    def steps(window: StepWindow | None) -> list[object]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Sigmoid())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        libraries = []
        if window is not None:
            window.open(model, "model")
        for _ in range(3):
            h = model(torch.randn(2, 4))
            h.mul_(2)  # <window write>
            del h
            opt.step()
            libraries.append(write_kernels._REGISTRATION.library)
        if window is not None:
            window.close()
        return libraries

    fast = StepWindow(3, None, sorted(FAST_MODE_RULES), None, 2, deep=False)
    libraries = steps(fast)
    assert libraries[0] is not None and all(lib is libraries[0] for lib in libraries)
    end_linger()
    assert registered() == 0
    deep = StepWindow(3, None, sorted(FAST_MODE_RULES), None, 2, deep=True)
    assert steps(deep) == [None] * 3
    assert fast.report is not None and deep.report is not None
    assert fast.report.stats["fast_tracer"] == 1
    assert _findings(fast.report) == _findings(deep.report)


def test_the_fast_tracer_keeps_no_graph_dropped_without_backward_alive() -> None:
    """Forward passes with grad on and no backward (no write either): each graph's saved tensors
    are freed when the program drops it. Deep mode names a node's saved tensors at the next op (the
    last node waits for one); the fast tracer names them as the node is made, and holds none."""
    model = nn.Sequential(nn.Linear(16, 16), nn.Sigmoid())
    live = {}
    for deep in (True, False):
        with ipd.watch(deep=deep, select=sorted(FAST_MODE_RULES)) as session:
            for _ in range(20):
                model(torch.randn(8, 16))
            live[deep] = session.tracer.live_saved_tensors()
    assert live[True] <= 2 and live[False] == 0


def test_the_fast_tracer_names_saved_tensors_as_their_node_is_made() -> None:
    """Nothing is held for later naming: the node, field and op of each saved tensor are known
    as soon as its node exists, and the node records where it was made with its saves' stack."""
    from inplace_doctor.trace.places.nodes import origin_of

    with ipd.watch(deep=False, select=sorted(FAST_MODE_RULES)) as session:
        x = torch.randn(3, 4, requires_grad=True)
        y = torch.sigmoid(x * 2)  # <saved here>
        tracer = session.tracer
        assert tracer._saved.pending_nodes == []
        [record] = tracer.saved_records(y.untyped_storage().data_ptr())
        assert (record.node, record.field, record.op) == ("SigmoidBackward0", "result", "aten.sigmoid")
        created = origin_of(y.grad_fn)
        assert created is not None and created.stack is record.stack
        assert created.site().line == line_of(SOURCE, "# <saved here>")
