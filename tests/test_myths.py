"""docs/myths.md matches a fresh run of the experiments in examples/myths/."""

from __future__ import annotations

from inplace_doctor.cli.main import main as cli_main
from inplace_doctor.myths import main


def test_docs_myths_matches_a_fresh_run(capsys) -> None:
    assert main(["--check"]) == 0, "run: python -m inplace_doctor.myths --write"
    out = capsys.readouterr().out
    assert "**ERROR**" not in out and "c09_memory_saving" in out


def test_one_experiment_by_name_and_a_clear_error_for_an_unknown_one(capsys) -> None:
    assert cli_main(["myths", "c24"]) == 0
    assert "TypeError: 'bool' object is not callable" in capsys.readouterr().out
    assert cli_main(["myths", "c99"]) == 2
    assert "no experiment matches 'c99'" in capsys.readouterr().err
