"""docs/myths.md matches a fresh run of the experiments shipped in src/inplace_doctor/myths/experiments/."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import inplace_doctor
from inplace_doctor.cli.main import main as cli_main
from inplace_doctor.myths import FOLDER, experiments

# tools/myths.py (writes and checks docs/myths.md) is a checkout tool, not in the wheel: loaded by its path.
_spec = importlib.util.spec_from_file_location("tools_myths", Path(__file__).resolve().parents[2] / "tools" / "myths.py")
tools_myths = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(tools_myths)  # type: ignore[union-attr]


def test_docs_myths_matches_a_fresh_run(capsys) -> None:
    assert tools_myths.main(["--check"]) == 0, "run: python tools/myths.py --write"
    out = capsys.readouterr().out
    assert "**ERROR**" not in out and "c09_memory_saving" in out


def test_one_experiment_by_name_and_a_clear_error_for_an_unknown_one(capsys) -> None:
    assert cli_main(["myths", "c24"]) == 0
    assert "TypeError: 'bool' object is not callable" in capsys.readouterr().out
    assert cli_main(["myths", "c99"]) == 2
    assert "no experiment matches 'c99'" in capsys.readouterr().err


def test_the_experiments_ship_inside_the_package() -> None:
    """`inplace-doctor myths` works from a wheel: the experiments are package data, found from the package itself."""
    assert FOLDER.is_relative_to(Path(inplace_doctor.__file__).resolve().parent)
    assert len(experiments()) >= 30
