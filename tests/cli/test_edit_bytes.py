"""The edits a report carries are the bytes `fix` writes (issue 38, item 5).

A consumer of the JSON (or SARIF) report applies an edit mechanically: decode the
file as the schema says (its BOM, PEP 263 coding line, else UTF-8; lines end at
\\n, \\r\\n or a lone \\r), check the text from `start` to `end` reads `old`, splice
`new` in its place, encode it back. For a CRLF file with a BOM, a CR-only file and a
latin-1 file with a coding line, that must give exactly the bytes `inplace-doctor fix`
writes: the edit texts carry the file's own line endings.
"""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
import tokenize
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from programs import git_project

from inplace_doctor.cli.proof.source_edits import Source as FileBytes
from inplace_doctor.cli.proof.source_edits import apply_to_source
from inplace_doctor.findings import Position
from inplace_doctor.rules.fixes.source import read

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "render" / "golden"


def decoded(data: bytes) -> tuple[str, str]:
    """The file's text as the schema's positions count it, and the codec that gives its bytes back."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return data.decode(encoding), encoding  # utf-8-sig: the BOM is not text, and is written back


def apply_mechanically(data: bytes, edits: list[dict[str, Any]]) -> bytes:
    """The JSON edits spliced into the decoded file, as a consumer that reads only the schema would."""
    text, encoding = decoded(data)
    lines = io.StringIO(text, newline="").readlines()  # \n, \r\n and a lone \r end a line; nothing else does
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(pos: dict[str, int]) -> int:
        return starts[pos["line"] - 1] + pos["column"]

    for edit in sorted(edits, key=lambda e: (offset(e["start"]), offset(e["end"])), reverse=True):
        begin, end = offset(edit["start"]), offset(edit["end"])
        assert text[begin:end] == edit["old"], (text[begin:end], edit)
        text = text[:begin] + edit["new"] + text[end:]
    return text.encode(encoding)


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inplace_doctor", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


# Each program has one finding, and its one fix with edits is proven: what `fix` writes is that fix.
CLONE = """\
import torch

torch.manual_seed(0)
w = torch.randn(4, requires_grad=True)
opt = torch.optim.SGD([w], lr=0.1)
for _ in range(2):
    opt.zero_grad()
    h = torch.sigmoid(w)  # écrit
    h[0] = 0
    h.sum().backward()
    opt.step()
print(w.tolist())
"""
REBIND = """\
# -*- coding: latin-1 -*-
import torch

torch.manual_seed(0)
w = torch.randn(4, requires_grad=True)
opt = torch.optim.SGD([w], lr=0.1)
for _ in range(2):
    opt.zero_grad()
    h = torch.sigmoid(w)
    s = 'é'; h.mul_(2)  # é before the write: columns count characters, not bytes
    h.sum().backward()
    opt.step()
print(w.tolist(), s)
"""
PROGRAMS = {
    "lf": CLONE.encode(),
    "crlf-bom": b"\xef\xbb\xbf" + CLONE.replace("\n", "\r\n").encode(),
    "cr": CLONE.replace("\n", "\r").encode(),
    "latin-1": REBIND.encode("latin-1"),
}


class RunThenFix(NamedTuple):
    """`run --format json`, then (for the SARIF test) `run --prove --format sarif`, then `fix`, of one
    committed program: the runs write nothing into the project, so the one `fix` (a whole proof: three
    Pythons or more) serves every test that compares its bytes with what a report's edits give."""

    data: bytes
    json_run: subprocess.CompletedProcess[str]
    report: dict[str, Any]
    sarif_run: subprocess.CompletedProcess[str] | None
    sarif: dict[str, Any] | None
    fixed: subprocess.CompletedProcess[str]
    after: bytes


def run_then_fix(tmp_path: Path, name: str, with_sarif: bool) -> RunThenFix:
    data = PROGRAMS[name]
    project = git_project(tmp_path, {"train.py": data})
    json_run = cli("run", "--format", "json", "--output", str(tmp_path / "report.json"), "train.py", cwd=project)
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    sarif_run = sarif = None
    if with_sarif:
        sarif_run = cli("run", "--prove", "--format", "sarif", "--output", str(tmp_path / "report.sarif"), "train.py",
                        cwd=project)
        sarif = json.loads((tmp_path / "report.sarif").read_text(encoding="utf-8"))
    assert (project / "train.py").read_bytes() == data  # neither run wrote the file: fix starts from the commit
    fixed = cli("fix", "train.py", cwd=project)
    return RunThenFix(data, json_run, report, sarif_run, sarif, fixed, (project / "train.py").read_bytes())


@pytest.fixture(scope="module")
def crlf_bom_fixed(tmp_path_factory: pytest.TempPathFactory) -> RunThenFix:
    """The CRLF file with a BOM: read by the JSON edits' test and by the SARIF replacements' test."""
    return run_then_fix(tmp_path_factory.mktemp("crlf-bom"), "crlf-bom", with_sarif=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_the_json_edits_applied_mechanically_are_the_bytes_fix_writes(
    tmp_path: Path, name: str, request: pytest.FixtureRequest
) -> None:
    done = request.getfixturevalue("crlf_bom_fixed") if name == "crlf-bom" else run_then_fix(tmp_path, name, False)
    data = done.data
    assert done.json_run.returncode == 1, done.json_run.stderr
    fixes = [fx for f in done.report["findings"] for fx in f["fixes"] if fx["edits"]]
    assert len(fixes) == 1, fixes
    expected = apply_mechanically(data, fixes[0]["edits"])
    assert expected != data
    assert done.fixed.returncode == 0, done.fixed.stdout + done.fixed.stderr
    assert done.after == expected


@pytest.mark.slow
def test_the_sarif_replacements_of_a_crlf_file_with_a_bom_are_the_bytes_fix_writes(crlf_bom_fixed: RunThenFix) -> None:
    data = crlf_bom_fixed.data
    assert crlf_bom_fixed.sarif_run is not None and crlf_bom_fixed.sarif is not None
    assert crlf_bom_fixed.sarif_run.returncode == 1, crlf_bom_fixed.sarif_run.stderr
    sarif = crlf_bom_fixed.sarif
    [replacement] = [r for result in sarif["runs"][0]["results"] for fx in result.get("fixes", ())
                     for change in fx["artifactChanges"] for r in change["replacements"]]
    region = replacement["deletedRegion"]  # 1-based columns, in code points (the run's columnKind)
    assert sarif["runs"][0]["columnKind"] == "unicodeCodePoints"
    text, _ = decoded(data)
    start = {"line": region["startLine"], "column": region["startColumn"] - 1}
    end = {"line": region["endLine"], "column": region["endColumn"] - 1}
    line = io.StringIO(text, newline="").readlines()[start["line"] - 1]
    old = line[start["column"] : end["column"]]  # the region is within one line here
    edit = {"start": start, "end": end, "old": old, "new": replacement["insertedContent"]["text"]}
    assert "\r\n" in edit["new"]  # the inserted line ends as the file's lines do
    assert crlf_bom_fixed.fixed.returncode == 0, crlf_bom_fixed.fixed.stdout + crlf_bom_fixed.fixed.stderr
    assert crlf_bom_fixed.after == apply_mechanically(data, [edit])


@pytest.mark.parametrize("ending", ["\r\n", "\r", "\n", "mixed"])
@pytest.mark.parametrize("last", ["", "final"], ids=["no-final-ending", "final-ending"])
def test_an_edit_built_from_the_source_reads_and_writes_the_files_own_endings(
    tmp_path: Path, ending: str, last: str
) -> None:
    """`rules/fixes/source.py` `Source.edit`: a multi-line `old` (a moved block) and a `new` with line breaks,
    spliced mechanically, equal what `apply_to_source` (fix) writes, in every ending and at a last line
    without one."""
    lines = ["import torch", "h = torch.ones(2)", "with torch.no_grad():", "    h.mul_(2)", "g = h"]
    ends = ["\r\n", "\n", "\r", "\r\n", ""] if ending == "mixed" else [ending] * 4 + [""]
    text = "".join(line + end for line, end in zip(lines, ends)) + ("\n" if last and ending == "mixed" else "")
    if last and ending != "mixed":
        text += ending
    path = tmp_path / "m.py"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    source = read(str(path))
    assert source is not None
    edits = [
        source.edit(Position(3, 0), Position(5, 0), "with torch.no_grad():\n    h.mul_(2)\n", ""),  # delete the block
        source.edit(Position(5, 5), Position(5, 5), "", "\nwith torch.no_grad():\n    h.mul_(2)"),  # after the last line
        source.edit(Position(2, 0), Position(2, 0), "", "x = 1\n"),  # a line inserted
    ]
    data = path.read_bytes()
    as_dicts = [e.to_dict() for e in edits]
    assert apply_mechanically(data, as_dicts) == apply_to_source("m.py", FileBytes.of(data, "m.py"), edits)


def golden_edits() -> list[tuple[str, int, list[dict[str, Any]]]]:
    """(golden file, fix number, the fix's edits) for every fix with edits in a golden JSON output."""
    out = []
    for golden in sorted(GOLDEN.glob("*.json")):
        report = json.loads(golden.read_text(encoding="utf-8"))
        fixes = [fx for f in report["findings"] for fx in f["fixes"] if fx["edits"]]
        out.extend((golden.name, n, fx["edits"]) for n, fx in enumerate(fixes))
    return out


def test_the_golden_outputs_hold_edits() -> None:
    assert len(golden_edits()) >= 3  # the next test must have something to apply


@pytest.mark.parametrize(("golden", "number", "edits"), golden_edits(), ids=[f"{g}-{n}" for g, n, _ in golden_edits()])
def test_every_golden_edit_applied_mechanically_parses_and_is_what_fix_writes(
    golden: str, number: int, edits: list[dict[str, Any]]
) -> None:
    from inplace_doctor.findings import Fix

    edits = [{**e, "path": str(ROOT / e["path"].replace("<ROOT>/", ""))} for e in edits]
    [path] = {e["path"] for e in edits}
    data = Path(path).read_bytes()
    after = apply_mechanically(data, edits)
    ast.parse(after)
    fix = Fix.from_dict({"kind": "other", "edits": edits})
    assert after == apply_to_source(path, FileBytes.read(path), fix.edits), (golden, number)
