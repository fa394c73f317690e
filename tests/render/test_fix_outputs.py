"""Fixes in the machine outputs: the JSON report's `fixes[].edits` and SARIF's `fixes[]` (proven only).

The reports come from real audits of the bundled examples; a fix is marked proven here by
hand (`inplace-doctor fix` is what proves one) to see how SARIF carries it.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch

import inplace_doctor as ipd
from inplace_doctor.examples import SigmoidThenReLU
from inplace_doctor.findings import Applicability, Edit, Fix, FixKind, Position
from inplace_doctor.render import json as json_format
from inplace_doctor.render import sarif
from inplace_doctor.report import Report

SARIF_SCHEMA = Path(__file__).parent / "data" / "sarif-schema-2.1.0.json"
REPORT_SCHEMA = Path(ipd.__file__).parent / "schema" / "report.schema.json"


@pytest.fixture(scope="module")
def report() -> Report:
    torch.manual_seed(0)
    return ipd.audit(SigmoidThenReLU(), torch.randn(4, 8))


def _proven(report: Report) -> Report:
    findings = [
        f.with_(fixes=tuple(dataclasses.replace(x, applicability=Applicability.PROVEN) for x in f.fixes))
        for f in report.findings
    ]
    return dataclasses.replace(report, findings=findings)


def _render(render: Any, report: Report) -> Any:
    stream = io.StringIO()
    render(report, stream)
    return json.loads(stream.getvalue())


def _validator(path: Path, cls: Any) -> Any:
    schema = json.loads(path.read_text())
    cls.check_schema(schema)
    return cls(schema)


def test_the_json_report_carries_each_fix_as_edits_and_validates(report: Report) -> None:
    data = _render(json_format.render, report)
    assert list(_validator(REPORT_SCHEMA, jsonschema.Draft202012Validator).iter_errors(data)) == []
    assert data["schema_version"] == 3
    (finding,) = data["findings"]
    (fix,) = finding["fixes"]
    assert (fix["kind"], fix["applicability"]) == ("flag-off-at-constructor", "unsafe")
    (edit,) = fix["edits"]
    assert (edit["old"], edit["new"]) == ("True", "False")
    assert edit["path"].endswith("examples/__init__.py") and edit["start"]["line"] == report.findings[0].mutation.origin.line
    assert fix["message"].startswith("construct `model.act` with inplace=False at ")


def test_sarif_offers_only_proven_fixes(report: Report) -> None:
    unproven = _render(sarif.render, report)
    assert "fixes" not in unproven["runs"][0]["results"][0]  # an unsafe edit is never one click away
    log = _render(sarif.render, _proven(report))
    errors = list(_validator(SARIF_SCHEMA, jsonschema.Draft4Validator).iter_errors(log))
    assert errors == [], errors
    (result,) = log["runs"][0]["results"]
    (fix,) = result["fixes"]
    (change,) = fix["artifactChanges"]
    assert change["artifactLocation"]["uri"].endswith("examples/__init__.py")
    (replacement,) = change["replacements"]
    edit = report.findings[0].fixes[0].edits[0]
    assert replacement == {
        "deletedRegion": {
            "startLine": edit.start.line, "startColumn": edit.start.column + 1,
            "endLine": edit.end.line, "endColumn": edit.end.column + 1,
        },
        "insertedContent": {"text": "False"},
    }
    assert log["runs"][0]["columnKind"] == "unicodeCodePoints"


def test_sarif_groups_a_moves_two_edits_by_file_and_an_insertion_is_an_empty_region(report: Report) -> None:
    """A fix spanning two files (a step moved after a backward in another one) is one SARIF fix."""
    a, b = str(Path.cwd() / "train.py"), str(Path.cwd() / "loop.py")
    move = Fix(
        FixKind.MOVE_STATEMENT,
        (Edit(a, Position(3, 0), Position(4, 0), "opt.step()\n", ""), Edit(b, Position(9, 15), Position(9, 15), "", "\nopt.step()")),
        Applicability.PROVEN,
    )
    finding = report.findings[0].with_(fixes=(move,))
    log = _render(sarif.render, dataclasses.replace(report, findings=[finding]))
    assert list(_validator(SARIF_SCHEMA, jsonschema.Draft4Validator).iter_errors(log)) == []
    changes = log["runs"][0]["results"][0]["fixes"][0]["artifactChanges"]
    assert [c["artifactLocation"]["uri"].rsplit("/", 1)[-1] for c in changes] == ["train.py", "loop.py"]
    assert changes[0]["replacements"][0]["deletedRegion"] == {"startLine": 3, "startColumn": 1, "endLine": 4, "endColumn": 1}
    assert changes[1]["replacements"][0]["deletedRegion"] == {"startLine": 9, "startColumn": 16, "endLine": 9, "endColumn": 16}


def test_run_writes_the_fix_as_edits_into_the_json_report(tmp_path: Path) -> None:
    """What `inplace-doctor fix` reads: `run --format json`, each edit naming the script it edits,
    at the written statement, whatever a string on that line says."""
    import os
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "x = torch.randn(5, requires_grad=True)\n"
        "h = torch.sigmoid(x)\n"
        'h[h > 0.5] = len("resumed at epoch:10 at other.py:2") * 0.0\n'
        "h.sum().backward()\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "inplace_doctor", "run", "--format", "json", "--output", "report.json", "train.py"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"}, check=False,
    )
    assert done.returncode == 1, done.stderr
    data = json.loads((tmp_path / "report.json").read_text())
    assert list(_validator(REPORT_SCHEMA, jsonschema.Draft202012Validator).iter_errors(data)) == []
    (finding,) = data["findings"]
    (fix,) = finding["fixes"]
    (edit,) = fix["edits"]
    assert fix["kind"] == "clone-before-write" and fix["applicability"] == "unsafe"
    assert (tmp_path / edit["path"]).resolve() == script.resolve()
    assert (edit["start"], edit["end"], edit["old"], edit["new"]) == (
        {"line": 4, "column": 0}, {"line": 4, "column": 0}, "", "h = h.clone()\n"
    )
