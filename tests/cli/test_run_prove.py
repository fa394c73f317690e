"""`inplace-doctor run --prove`: a report whose fixes were checked on the user's program.

A CI job runs the script once and uploads the SARIF: each fix proven on a copy of the
project is in the result's `fixes[]` (GitHub code scanning offers it as a suggested
change), and the JSON report carries every checked fix's evidence. No file of the user's
changes. The SARIF log is validated against the OASIS SARIF 2.1.0 schema, the JSON report
against ours (as tests/render/test_fix_outputs.py does for hand-marked fixes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
from programs import ACTOR_CRITIC, TWO_STEP_TRAIN

import inplace_doctor as ipd

ROOT = Path(__file__).resolve().parents[2]
SARIF_SCHEMA = ROOT / "tests" / "render" / "data" / "sarif-schema-2.1.0.json"
REPORT_SCHEMA = Path(ipd.__file__).parent / "schema" / "report.schema.json"


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inplace_doctor", "run", *args],
        capture_output=True, text=True, timeout=600, cwd=cwd, env={**os.environ, "NO_COLOR": "1"},
    )


def _errors(schema: Path, cls: Any, instance: Any) -> list[str]:
    loaded = json.loads(schema.read_text())
    cls.check_schema(loaded)
    return [e.message for e in cls(loaded).iter_errors(instance)]


def test_run_prove_writes_a_sarif_log_whose_result_offers_the_proven_edit(tmp_path: Path) -> None:
    (tmp_path / "broken_train.py").write_text(TWO_STEP_TRAIN)
    done = run_cli("--prove", "--format", "sarif", "--output", "ipd.sarif", "broken_train.py", cwd=tmp_path)
    assert done.returncode == 1, done.stderr  # the finding is still there: a CI job fails on it
    assert (tmp_path / "broken_train.py").read_text() == TWO_STEP_TRAIN  # proven on a copy only
    assert "checking the fix" not in done.stderr  # with --output the terminal keeps the script's output only
    log = json.loads((tmp_path / "ipd.sarif").read_text())
    assert _errors(SARIF_SCHEMA, jsonschema.Draft4Validator, log) == []
    (result,) = log["runs"][0]["results"]
    assert result["ruleId"] == "IPD101"
    (fix,) = result["fixes"]
    (change,) = fix["artifactChanges"]
    assert change["artifactLocation"]["uri"] == "broken_train.py"
    (replacement,) = change["replacements"]
    assert replacement == {
        "deletedRegion": {"startLine": 19, "startColumn": 9, "endLine": 19, "endColumn": 9},
        "insertedContent": {"text": "feats = feats.clone()\n        "},
    }


def test_run_prove_json_marks_the_fix_proven_with_its_evidence(tmp_path: Path) -> None:
    (tmp_path / "broken_train.py").write_text(TWO_STEP_TRAIN)
    done = run_cli("--prove", "--format", "json", "--output", "report.json", "broken_train.py", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    data = json.loads((tmp_path / "report.json").read_text())
    assert _errors(REPORT_SCHEMA, jsonschema.Draft202012Validator, data) == []
    (finding,) = data["findings"]
    (fix,) = finding["fixes"]
    assert fix["applicability"] == "proven"
    assert fix["evidence"] == {
        "checked": True, "equal": True, "finding_gone": True, "new_findings": [], "steps": 2, "first_difference": "",
    }
    assert any(note.startswith("--prove: 1 fix(es) proven on this program") for note in data["notes"])




def test_a_fix_that_changes_the_results_stays_unsafe_with_the_first_difference_and_sarif_offers_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text(ACTOR_CRITIC)
    done = run_cli("--prove", "--format", "json", "train.py", cwd=tmp_path)  # the report on stderr
    assert done.returncode == 1, done.stderr
    assert "inplace-doctor: checking the fix for IPD101 at train.py:20 on a copy of the project" in done.stderr
    data = json.loads(done.stderr[done.stderr.index("{\n") : done.stderr.rindex("}") + 1])
    assert _errors(REPORT_SCHEMA, jsonschema.Draft202012Validator, data) == []
    fixes = [fx for f in data["findings"] for fx in f["fixes"] if fx["edits"]]
    assert fixes and all(fx["applicability"] == "unsafe" for fx in fixes)
    (move,) = [fx for fx in fixes if fx["kind"] == "move-statement"]
    assert move["evidence"]["checked"] and move["evidence"]["finding_gone"] and not move["evidence"]["equal"]
    assert move["evidence"]["first_difference"]
    assert any(note.startswith("--prove: no fix proven: ") for note in data["notes"])
    assert (tmp_path / "train.py").read_text() == ACTOR_CRITIC
