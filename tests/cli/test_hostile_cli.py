"""Hostile command-line input: each mistake is one line on stderr and exit 2, found before any work runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import inplace_doctor as ipd
import inplace_doctor.api
from inplace_doctor.cli.main import main

BROKEN = "inplace_doctor.examples:sigmoid_then_relu"


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run a misuse; check exit 2, nothing on stdout, exactly one stderr line; return that line."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("inplace-doctor: error: ")
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """The jobs themselves fail the test: a usage error must come before any of them starts."""

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("the job ran before the usage error")

    for name in ("audit", "memory", "optimize"):
        monkeypatch.setattr(inplace_doctor.api, name, forbidden)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    """A script that leaves a marker file when it runs."""
    path = tmp_path / "train.py"
    path.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n", encoding="utf-8")
    return path


# --- 1. an empty --select / --ignore ---------------------------------------------------------


@pytest.mark.parametrize("option", ["--select", "--ignore"])
@pytest.mark.parametrize("value", ["", ",", " , "])
def test_empty_rule_selection_in_audit_is_a_usage_error(capsys, no_work, option, value):
    line = usage_error(capsys, "audit", BROKEN, option, value)
    assert option in line
    assert "IPD101" in line


@pytest.mark.parametrize("option", ["--select", "--ignore"])
def test_empty_rule_selection_in_run_is_a_usage_error_before_the_script(capsys, script, option):
    line = usage_error(capsys, "run", option, "", str(script))
    assert option in line and "IPD101" in line
    assert not (script.parent / "ran").exists()


# --- 2. --input shapes -------------------------------------------------------------------------


def test_input_with_nothing_after_the_colon_is_refused(capsys, no_work):
    line = usage_error(capsys, "audit", BROKEN, "--input", "2x8:")
    assert "'2x8:'" in line
    assert "SHAPE:DTYPE" in line


@pytest.mark.parametrize("shape", ["99999999999999999999x8", "1099511627776x8", "1099511627776x8:float16"])
def test_input_too_large_to_allocate_is_one_line(capsys, no_work, shape):
    line = usage_error(capsys, "audit", BROKEN, "--input", shape)
    assert repr(shape) in line
    assert "could not be allocated" in line
    assert "bytes" in line


# --- 3. --seed range ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", ["99999999999999999999999", str(2**64), str(-(2**63) - 1)])
def test_seed_out_of_torch_range_is_a_usage_error(capsys, no_work, seed):
    line = usage_error(capsys, "audit", BROKEN, "--seed", seed)
    assert "--seed" in line and seed in line
    assert str(2**64 - 1) in line


@pytest.mark.parametrize("seed", [2**64 - 1, -(2**63)])
def test_seed_at_the_ends_of_the_range_is_accepted_and_works(seed):
    from inplace_doctor.cli.args import seed_value

    assert seed_value(str(seed)) == seed
    torch.Generator().manual_seed(seed)  # what the CLI then does with it


# --- 4. --format help from the renderers -------------------------------------------------------


@pytest.mark.parametrize("command", ["audit", "run"])
def test_format_help_lists_every_renderer(capsys, monkeypatch, command):
    from inplace_doctor import render

    monkeypatch.setitem(render.FORMATS, "xmlish", render.FORMATS["json"])
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "json, sarif or xmlish" in out


def test_memory_help_lists_only_what_memory_accepts(capsys):
    with pytest.raises(SystemExit):
        main(["memory", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--format FORMAT text or json" in out
    line = usage_error(capsys, "memory", BROKEN, "--format", "sarif")
    assert "text or json" in line


# --- 5. apply_config with something that is not a path or a mapping --------------------------


@pytest.mark.parametrize("bad", [3, None, 1.5, b"inplace.toml"])
def test_apply_config_refuses_other_types_by_name(bad):
    model = nn.Sequential(nn.ReLU())
    with pytest.raises(ipd.UsageError, match=type(bad).__name__):
        ipd.apply_config(model, bad)


def test_apply_config_does_not_close_a_file_descriptor(tmp_path):
    fd = os.open(tmp_path / "f", os.O_CREAT | os.O_RDWR)
    try:
        with pytest.raises(ipd.UsageError):
            ipd.apply_config(nn.Sequential(nn.ReLU()), fd)
        os.fstat(fd)  # still open
    finally:
        os.close(fd)


# --- 6. output paths checked before the work ---------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["audit", BROKEN, "--html", "{missing}/x.html"],
        ["audit", BROKEN, "--output", "{missing}/x.txt"],
        ["audit", BROKEN, "--html", "{file}/x.html"],
        ["audit", BROKEN, "--html", "{folder}"],
        ["memory", BROKEN, "--html", "{missing}/x.html"],
        ["memory", BROKEN, "--png", "{missing}/x.png"],
        ["optimize", BROKEN, "--html", "{missing}/x.html"],
        ["optimize", BROKEN, "--png", "{missing}/x.png"],
        ["optimize", BROKEN, "--write", "{missing}/inplace.toml"],
    ],
)
def test_output_paths_are_checked_before_the_job_runs(capsys, no_work, tmp_path, argv):
    (tmp_path / "a-file").write_text("")
    places = {"missing": str(tmp_path / "nodir"), "file": str(tmp_path / "a-file"), "folder": str(tmp_path)}
    argv = [a.format(**places) for a in argv]
    line = usage_error(capsys, *argv)
    assert "cannot write" in line
    assert argv[-1] in line


# --- 7. run -m a module that does not exist ----------------------------------------------------


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pkg = tmp_path / "ipd_hostile_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "bad.py").write_text("import ipd_hostile_no_such_dependency\n")
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith("ipd_hostile_pkg")]:
        del sys.modules[name]


@pytest.mark.parametrize("target", ["ipd_hostile_nonexistent_module", "ipd_hostile_pkg.nope", "ipd_hostile_nope.sub"])
def test_run_m_a_missing_module_is_a_usage_error(capsys, modules, target):
    line = usage_error(capsys, "run", "-m", target)
    assert repr(target) in line
    assert "-m" in line


def test_run_m_a_close_name_suggests_it(capsys):
    line = usage_error(capsys, "run", "-m", "json.tol")
    assert "'json.tool'" in line


def test_run_m_a_module_whose_own_import_fails_is_the_scripts_error(capsys, modules):
    code = main(["run", "-m", "ipd_hostile_pkg.bad"])
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback" in err
    assert "ipd_hostile_no_such_dependency" in err
    assert "inplace-doctor: error:" not in err


# --- 8. run --output to a missing folder -------------------------------------------------------


def test_run_output_to_a_missing_folder_fails_before_the_script(capsys, script, tmp_path):
    target = tmp_path / "nodir" / "r.txt"
    line = usage_error(capsys, "run", "--output", str(target), str(script))
    assert str(target) in line
    assert not (tmp_path / "ran").exists()
