"""`inplace-doctor run`: the script's own stdout, stderr and traceback stay as python prints
them; the tool adds its diagnosis and report after them, or writes them only to --output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from inplace_doctor.cli.main import main

# One SGD step, then an in-place op on a parameter (PyTorch raises at the op: IPD102).
LEAF_AFTER_A_STEP = textwrap.dedent("""
    import sys
    import torch
    from torch import nn

    def update(model):
        model.weight.add_(1)  # PyTorch raises here: a leaf that requires grad

    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    print("stepped")
    print("a warning of its own", file=sys.stderr)
    update(model)
""")

# exp's saved output overwritten, then backward: the tool raises InplaceError in backward.
STALE_IN_BACKWARD = textwrap.dedent("""
    import torch

    def train():
        w = torch.randn(3, requires_grad=True)
        y = w.exp()
        y.add_(1)
        y.sum().backward()

    train()
""")

FAILS_AFTER_TWO_STEPS = textwrap.dedent("""
    import torch
    from torch import nn

    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 4):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    raise ValueError("diverged")
""")

DIAGNOSIS = "inplace-doctor: the script stopped at an in-place error ({code}): "
# PyTorch refused the op (IPD102, IPD103): nothing was overwritten, and there is one line
REFUSED = "inplace-doctor: the script stopped where PyTorch refused the in-place `{op}` at {where} ({code}); "


def python(script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=script.parent)


def tool(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inplace_doctor", "run", *argv], capture_output=True, text=True, timeout=300, cwd=cwd,
        env={**os.environ, "NO_COLOR": "1"},
    )


def write(tmp_path: Path, source: str) -> Path:
    script = tmp_path / "train.py"
    script.write_text(source)
    return script


def test_a_pytorch_error_at_an_op_keeps_the_scripts_traceback_then_adds_the_diagnosis(tmp_path: Path) -> None:
    script = write(tmp_path, LEAF_AFTER_A_STEP)
    plain, done = python(script), tool(str(script), cwd=tmp_path)
    assert plain.returncode == done.returncode == 1
    assert done.stdout == plain.stdout == "stepped\n"
    assert [line for line in plain.stderr.splitlines() if not line.strip().startswith("^")][-3:] == [
        f'  File "{script}", line 7, in update',
        "    model.weight.add_(1)  # PyTorch raises here: a leaf that requires grad",
        "RuntimeError: a leaf Variable that requires grad is being used in an in-place operation.",
    ]
    assert done.stderr.startswith(plain.stderr), done.stderr  # python's traceback, line for line
    added = done.stderr[len(plain.stderr) :].splitlines()
    assert added[0].startswith(REFUSED.format(op="add_", where="train.py:7", code="IPD102")), added[0]
    assert "overwrote" not in added[0]
    assert added[1] == f"inplace-doctor run of {script}"
    assert re.fullmatch(
        r"inplace-doctor: 1 finding\(s\); watched 1 optimizer step \(\d+\.\d\d s from the start, imports included\)",
        added[-1],
    ), added[-1]


def test_an_inplace_error_in_backward_shows_pytorchs_error_in_the_scripts_frames(tmp_path: Path) -> None:
    script = write(tmp_path, STALE_IN_BACKWARD)
    plain, done = python(script), tool(str(script), cwd=tmp_path)
    assert plain.returncode == done.returncode == 1
    expected = plain.stderr.splitlines()
    lines = done.stderr.splitlines()
    # First, where the in-place write ran (chained in front of PyTorch's error, as python prints a cause) ...
    written = lines.index("The above exception was the direct cause of the following exception:")
    assert lines[0] == "inplace_doctor.errors.WrittenHere: the in-place write `add_` ran here (most recent call last):"
    assert any(line.strip() == "y.add_(1)" for line in lines[:written]), done.stderr
    assert lines[written + 1] == ""
    lines = lines[written + 2 :]
    # ... then the same frames (the script's, then PyTorch's backward); the tool's own frames are left out.
    assert lines[: len(expected) - 1] == expected[:-1], done.stderr
    assert expected[-1].startswith("RuntimeError: one of the variables needed for gradient computation")
    assert lines[len(expected) - 1].startswith(
        "RuntimeError: one of the variables needed for gradient computation has been modified by an inplace "
        "operation: [torch.FloatTensor [3]]"
    ), done.stderr
    assert lines[len(expected)].startswith(DIAGNOSIS.format(code="IPD101") + "`add_` at train.py:7 overwrote"), done.stderr
    assert "inplace_doctor" not in "\n".join(lines[: len(expected)])
    assert lines[-1] == "inplace-doctor: 1 finding(s); no backward pass completed"


def test_a_failure_after_the_window_is_pythons_traceback_then_the_last_line(tmp_path: Path) -> None:
    script = write(tmp_path, FAILS_AFTER_TWO_STEPS)
    plain, done = python(script), tool("--steps", "2", str(script), cwd=tmp_path)
    assert plain.returncode == done.returncode == 1
    assert plain.stderr.splitlines()[-1] == "ValueError: diverged"
    assert done.stderr.startswith(plain.stderr), done.stderr
    [last] = done.stderr[len(plain.stderr) :].splitlines()
    assert re.fullmatch(
        r"inplace-doctor: 0 finding\(s\); watched 2 optimizer steps, \d+\.\d ms per step after the first; "
        r"then 1 unwatched \(step 3\), too few for a figure without its warm-up; "
        r"the script failed after the watched window \(--steps 2\): "
        r"run with --steps 4 to watch the failing step",
        last,
    ), last


@pytest.fixture(scope="module")
def plain_leaf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    script = write(tmp_path_factory.mktemp("leaf"), LEAF_AFTER_A_STEP)
    return script, python(script)


@pytest.mark.parametrize("fmt", ["text", "json", "sarif"])
def test_output_file_leaves_the_terminal_to_the_script(
    fmt: str, plain_leaf: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path, capsys
) -> None:
    script, plain = plain_leaf
    report = tmp_path / f"report.{fmt}"
    status = main(["run", "--format", fmt, "--output", str(report), str(script)])
    out, err = capsys.readouterr()
    assert status == 1
    assert (out, err) == (plain.stdout, plain.stderr)  # nothing from the tool: no report, no summary line
    text = report.read_text()
    watched = r"watched 1 optimizer step \(\d+\.\d\d s from the start, imports included\)"
    if fmt == "text":
        lines = text.splitlines()
        assert lines[0] == f"inplace-doctor run of {script}" and lines[-1] == "1 finding: 1 error"
        assert re.fullmatch(f"note: {watched}", lines[-2]), lines[-2]
    elif fmt == "json":
        data = json.loads(text)
        assert data["command"] == "run" and [f["code"] for f in data["findings"]] == ["IPD102"]
        assert re.fullmatch(watched, data["notes"][-1]), data["notes"]
    else:
        data = json.loads(text)
        assert data["version"] == "2.1.0" and [r["ruleId"] for r in data["runs"][0]["results"]] == ["IPD102"]


def test_json_without_output_goes_to_stderr_after_the_scripts_traceback(capsys, plain_leaf) -> None:
    script, plain = plain_leaf
    status = main(["run", "--format", "json", str(script)])
    out, err = capsys.readouterr()
    assert status == 1 and out == plain.stdout
    assert err.startswith(plain.stderr)
    added = err[len(plain.stderr) :]
    diagnosis, rest = added.split("\n", 1)
    body, last = rest.rstrip("\n").rsplit("\n", 1)
    assert diagnosis.startswith("inplace-doctor: the script stopped where PyTorch refused the in-place `add_` at ")
    assert [f["code"] for f in json.loads(body)["findings"]] == ["IPD102"]
    assert last.startswith("inplace-doctor: 1 finding(s); watched 1 optimizer step (")


def test_run_help_names_every_format_and_the_step_rule(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--format FORMAT report format: text (default), json or sarif" in text
    assert (
        "--steps N watch only the first N training steps, then run at full speed. A step is an optimizer step "
        "(step() of any torch.optim optimizer); until the first one is seen, and in a script without one, a "
        "backward pass." in text
    )
    assert "--output FILE write the report to FILE (default: stderr); the terminal then shows only the script's own output" in text
