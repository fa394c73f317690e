"""Hostile files and folders: paths and files that are not UTF-8, config paths that are folders,
outputs that would replace the user's files, config entries naming no module, empty inputs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.cli.main import main
from inplace_doctor.errors import UsageError

BROKEN = "inplace_doctor.examples:sigmoid_then_relu"
FACTORY = '''
import torch
from torch import nn


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = torch.sigmoid(self.fc(x))
        return y.mul_(2)  # overwrites what sigmoid saved


def broken():
    return Broken(), torch.randn(2, 8)
'''


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_usage_line(capsys, *argv: str) -> str:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2, (code, err)
    [line] = err.splitlines()
    assert line.startswith("inplace-doctor: error: ")
    return line


@pytest.fixture
def non_utf8_dir(tmp_path, monkeypatch) -> Path:
    """A working folder whose name holds the byte 0xff (a Latin-1 name on a UTF-8 system)."""
    folder = Path(os.fsdecode(os.path.join(os.fsencode(tmp_path), b"caf\xff")))
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def test_a_model_in_a_non_utf8_folder_is_audited_with_its_lines(capsys, non_utf8_dir, monkeypatch):
    (non_utf8_dir / "ipd_latin1_factory.py").write_text(FACTORY, encoding="utf-8")
    monkeypatch.syspath_prepend(str(non_utf8_dir))
    monkeypatch.delitem(sys.modules, "ipd_latin1_factory", raising=False)
    code, out, err = run_cli(capsys, "audit", "ipd_latin1_factory:broken")
    sys.modules.pop("ipd_latin1_factory", None)
    assert code == 1, err
    assert "IPD101" in out
    assert "ipd_latin1_factory.py:13" in out and "ipd_latin1_factory.py:12" in out  # both lines, still found


def test_a_script_in_a_non_utf8_folder_runs_and_its_report_is_written(capsys, non_utf8_dir):
    script = non_utf8_dir / "train.py"
    script.write_text(
        "import torch\n"
        "x = torch.randn(4, requires_grad=True)\n"
        "y = torch.sigmoid(x)\n"
        "y.mul_(2)\n"
        "y.sum().backward()\n",
        encoding="utf-8",
    )
    report = non_utf8_dir / "report.json"
    code, out, err = run_cli(capsys, "run", "--format", "json", "--output", str(report), str(script))
    assert code == 1, err
    text = report.read_text(encoding="utf-8", errors="surrogateescape")
    assert '"IPD101"' in text and '"line": 4' in text


def test_a_config_that_is_not_utf8_is_one_usage_line(capsys, tmp_path):
    config = tmp_path / "inplace.toml"
    config.write_bytes(b'[inplace]\n"caf\xff" = false\n')
    line = one_usage_line(capsys, "audit", BROKEN, "--config", str(config))
    assert "is not UTF-8 text" in line and "b'\\xff'" in line


def test_a_config_path_that_is_a_folder_is_one_usage_line(capsys, tmp_path):
    line = one_usage_line(capsys, "verify", BROKEN, "--config", str(tmp_path))
    assert "is a folder" in line


def test_a_pyproject_that_is_not_utf8_is_one_usage_line(capsys, tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_bytes(b'[tool.inplace-doctor]\nignore = ["IPD1\xff"]\n')
    monkeypatch.chdir(tmp_path)
    line = one_usage_line(capsys, "audit", BROKEN)
    assert "pyproject.toml" in line and "is not UTF-8 text" in line


# --- nothing the user wrote is replaced without --force ---------------------------------------


@pytest.fixture
def hand_edited(tmp_path) -> Path:
    path = tmp_path / "inplace.toml"
    path.write_text('[inplace]\n"act" = false  # keep: see issue 12\n', encoding="utf-8")
    return path


def test_optimize_write_refuses_an_existing_config_before_any_work(capsys, hand_edited, monkeypatch):
    import inplace_doctor.api

    monkeypatch.setattr(inplace_doctor.api, "optimize", lambda *a, **k: pytest.fail("optimize ran"))
    before = hand_edited.read_bytes()
    line = one_usage_line(capsys, "optimize", BROKEN, "--write", str(hand_edited))
    assert "exists" in line and "--force" in line
    assert hand_edited.read_bytes() == before


def test_optimize_write_force_replaces_and_shows_what_changed(capsys, hand_edited):
    code, out, err = run_cli(capsys, "optimize", "inplace_doctor.examples:residual_relu", "--no-checkpoint",
                             "--write", str(hand_edited), "--force")
    assert code in (0, 1), err
    assert f"replaced {hand_edited}; what changed:" in out
    assert '-"act" = false  # keep: see issue 12' in out  # the dropped hand edit, visible
    assert "[inplace]" in hand_edited.read_text(encoding="utf-8")


def test_plan_write_refuses_an_existing_file_unless_forced(hand_edited):
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 2))
    plan = ipd.optimize(model, torch.randn(4, 8), suggest_checkpoint=False)
    before = hand_edited.read_text(encoding="utf-8")
    with pytest.raises(UsageError, match="force=True"):
        plan.write(hand_edited)
    assert hand_edited.read_text(encoding="utf-8") == before
    assert plan.write(hand_edited, force=True) == before  # the replaced text comes back
    assert hand_edited.read_text(encoding="utf-8") == plan.toml()
    fresh = hand_edited.parent / "new.toml"
    assert plan.write(fresh) is None and fresh.read_text(encoding="utf-8") == plan.toml()


@pytest.mark.parametrize("option", ["--output", "--html"])
def test_a_report_never_replaces_a_file_that_is_not_a_report(capsys, tmp_path, option):
    script = tmp_path / "train.py"
    script.write_text("print('my training script')\n", encoding="utf-8")
    line = one_usage_line(capsys, "audit", BROKEN, option, str(script))
    assert "not a report of inplace-doctor's" in line and "--force" in line
    assert script.read_text(encoding="utf-8") == "print('my training script')\n"
    assert run_cli(capsys, "audit", BROKEN, option, str(script), "--force")[0] == 1
    assert "inplace-doctor" in script.read_text(encoding="utf-8")


def test_run_output_never_replaces_the_script_itself(capsys, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("open('ran', 'w').close()\n", encoding="utf-8")
    one_usage_line(capsys, "run", "--output", str(script), str(script))
    assert script.read_text(encoding="utf-8") == "open('ran', 'w').close()\n"


@pytest.mark.parametrize("fmt", ["text", "json", "sarif"])
def test_a_report_replaces_an_earlier_report_of_its_own(capsys, tmp_path, fmt):
    path = tmp_path / f"report.{fmt}"
    assert run_cli(capsys, "audit", BROKEN, "--format", fmt, "--output", str(path))[0] == 1
    first = path.read_text(encoding="utf-8")
    path.write_text(first.replace("IPD101", "IPD999"), encoding="utf-8")
    assert run_cli(capsys, "audit", BROKEN, "--format", fmt, "--output", str(path))[0] == 1  # no --force needed
    second = path.read_text(encoding="utf-8")
    assert "IPD999" not in second and "IPD101" in second


# --- config entries that match no module, empty inputs ------------------------------------------


def test_a_config_entry_with_no_close_path_lists_the_paths_that_can_be_set():
    import torchvision

    model = torchvision.models.resnet18(weights=None)
    with pytest.raises(UsageError) as info:
        ipd.apply_config(model, {"features.3": False})
    message = str(info.value)
    assert "matches no module of ResNet" in message
    assert "the modules with an `inplace` option are relu, layer1.0.relu" in message and "(9 in all)" in message


def test_a_config_entry_close_to_a_path_names_it():
    import torchvision

    with pytest.raises(UsageError, match="did you mean 'layer1.0.relu'"):
        ipd.apply_config(torchvision.models.resnet18(weights=None), {"model.layer1.0.relu": False})


def test_a_config_for_a_model_without_inplace_options_says_so():
    with pytest.raises(UsageError, match="no module of it has an `inplace` option"):
        ipd.apply_config(nn.Linear(2, 2), {"act": False})


@pytest.mark.parametrize("command", ["audit", "verify", "memory", "optimize"])
@pytest.mark.parametrize("shape", ["0x8", "2x0", "0"])
def test_an_empty_input_is_refused_with_a_shape_that_works(capsys, command, shape):
    line = one_usage_line(capsys, command, BROKEN, "--input", shape)
    assert "has a dimension of 0" in line and "e.g. " in line
