"""`inplace-doctor run --verify`: each model a script ran, verified against its out-of-place form
after the script ended, on the arguments of its first call."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

import inplace_doctor as ipd
from inplace_doctor.cli.scripts.script import run_script
from inplace_doctor.cli.scripts.script_verify import ModelCalls
from inplace_doctor.verification import VerifyOutcome

TRAIN = textwrap.dedent(
    """\
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.act = nn.ReLU(inplace=True)  # on the Linear's output, which backward does not need
            self.out = nn.Linear(8, 1)

        def forward(self, x, scale=1.0):
            h = self.fc(x)
            y = self.act(h)
            return self.out(y + SKIP) * scale


    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(4, 8)
        loss = nn.functional.mse_loss(model(x, scale=2.0), torch.zeros(4, 1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        x.mul_(0)  # the batch, changed after the step: verify uses the copy taken at the call
    print("trained")
    """
)


def run_verify(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "train.py").write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "inplace_doctor", "run", "--verify", "train.py"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"},
    )


CLEAN = TRAIN.replace("SKIP", "x.mean(1, keepdim=True)")  # nothing reads h after the ReLU wrote it
BROKEN = TRAIN.replace("SKIP", "h")  # the skip reads h after the in-place ReLU changed it (IPD105)


def test_a_model_whose_inplace_flags_keep_the_results_is_verified_equivalent(tmp_path: Path) -> None:
    done = run_verify(tmp_path, CLEAN)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "trained\n"
    lines = done.stderr.splitlines()
    assert "inplace-doctor: 0 finding(s); watched 3 optimizer steps" in lines[0]
    assert lines[1] == (
        "inplace-doctor: verify: `Net` (train mode, on the arguments of its first call): equivalent: outputs, "
        "loss, gradients, buffers and inputs match the out-of-place program (1 in-place sites, 2 runs)"
    )
    assert len(lines) == 2  # one model ran: the functional loss is no module


def test_an_inplace_flag_that_changes_the_result_is_named_and_run_exits_one(tmp_path: Path) -> None:
    broken = run_verify(tmp_path, BROKEN)
    assert broken.returncode == 1, broken.stderr
    assert "IPD105" in broken.stderr
    note = broken.stderr.split("note: verify: `Net`", 1)[1]
    assert note.startswith(" (train mode, on the arguments of its first call): not equivalent: output[0]:")
    assert "responsible: module act (inplace=True)" in note


def test_the_json_report_carries_each_verdict_as_a_record_and_the_exit_code_reads_it(tmp_path: Path) -> None:
    """`run --verify --format json`: `verify_results` holds the verdict (`outcome`, the differences,
    the responsible sites) as fields, valid against the published schema; the exit code is 1 from
    `outcome`, with the findings ignored (`--fail-on` above any severity would not fail them)."""
    import json

    import jsonschema

    from inplace_doctor.report import Report

    (tmp_path / "train.py").write_text(BROKEN)
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "inplace_doctor", "run", "--verify", "--ignore", "IPD1", "--format", "json",
         "--output", str(out), "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_COLOR": "1"},
    )
    assert done.returncode == 1, done.stderr
    data = json.loads(out.read_text())
    assert data["findings"] == []
    [verified] = data["verify_results"]
    assert verified["label"] == "Net" and verified["outcome"] == "not-equivalent" and verified["mode"] == "train"
    assert verified["differences"][0]["what"] == "output[0]" and verified["differences"][0]["max_abs"] > 0
    assert {"kind": "module", "where": "act"} in verified["culprits"]
    schema = json.loads((Path(ipd.__file__).parent / "schema" / "report.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(data)
    assert Report(findings=[]).verified_different is False


def test_the_recorded_call_is_a_copy_with_its_keyword_arguments_and_nothing_is_kept(tmp_path: Path) -> None:
    """In process: what `--verify` records (kwargs read from the call, a detached copy of the
    batch before the script changed it) and that nothing of the script's is kept after it."""
    (tmp_path / "train.py").write_text(CLEAN)
    models = ModelCalls()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        status, report, _ = run_script("train.py", [], models=models)
    finally:
        os.chdir(cwd)
    assert status == 0 and report.findings == []
    [call] = models.calls
    assert call.label == "Net" and call.kwargs == {"scale": 2.0} and call.training
    [x] = call.args
    assert not x.requires_grad and x.abs().sum() > 0  # the batch as it was at the call, not the zeroed one
    expected = ipd.verify(call.module, x, scale=2.0)
    [verified] = models.verify_all()
    assert verified.outcome is VerifyOutcome.EQUIVALENT and verified.result is not None and verified.result.equivalent
    assert verified.label == "Net" and verified.training and str(expected) in str(verified)
    assert models.calls == []


def test_in_a_process_group_nothing_is_run_and_the_note_says_why() -> None:
    models = ModelCalls()
    with ipd.watch() as session:
        models.observe(session.tracer.modules)
        torch.nn.Linear(2, 2)(torch.randn(1, 2)).sum().backward()
    [verified] = models.verify_all(rank=1)
    assert verified.outcome is VerifyOutcome.NOT_VERIFIED and verified.result is None
    assert "not run: the script trained in a process group (rank 1)" in str(verified)
    assert models.calls == []


def test_submodules_train_eval_flags_are_used_as_at_the_call_and_put_back_as_the_script_left_them(tmp_path: Path) -> None:
    """A training model with a frozen BatchNorm (eval inside train): verified in those flags, and
    afterwards every submodule's flag is the script's again, not the root's copied down."""
    (tmp_path / "train.py").write_text(textwrap.dedent(
        """\
        import torch
        from torch import nn

        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(inplace=True), nn.Linear(4, 1))
        model.train()
        model[1].eval()  # frozen statistics, as fine-tuning recipes do
        model(torch.randn(8, 4)).sum().backward()
        model.eval()
        model[3].train()  # the script's last word on the flags
        """
    ))
    models = ModelCalls()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        status, _, _ = run_script("train.py", [], models=models)
    finally:
        os.chdir(cwd)
    assert status == 0
    [call] = models.calls
    model = call.module
    assert [flag for _, flag in call.modes] == [True, True, False, True, True]
    [verified] = models.verify_all()
    assert verified.outcome is VerifyOutcome.EQUIVALENT and "(train mode," in str(verified)
    assert [m.training for m in model.modules()] == [False, False, False, False, True]
