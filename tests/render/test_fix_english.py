"""A fix's English has one source, its records: every "replace `A` with `B`" the tool prints anywhere
is an edit built from the source, and a finding without an edit presents no made-up code as one.

Each program is a small real script, run under `watch()` (the deep tracer too where it could see
another write of the line) and under `watch(fail_fast=True)`; every text the user reads about a finding (the text report, `message`, the
JSON's `message` and `fixes[].message`, the exception `fail_fast` raises) is read, and applying the
finding's first fix's edits must give a program that runs with the finding gone.
"""

from __future__ import annotations

import ast
import io
import json
import re
import runpy
from pathlib import Path

import pytest
import torch

import inplace_doctor as ipd
from inplace_doctor import Severity
from inplace_doctor.findings import Edit, Finding
from inplace_doctor.render import json as json_format
from inplace_doctor.render import text as text_format
from inplace_doctor.render.code_text import one_line

HEAD = "import torch\nfrom torch import nn\nimport torch.nn.functional as F\ntorch.manual_seed(0)\nx = torch.randn(4, requires_grad=True)\n"

# name -> (the lines after HEAD, the rule, whether a fix with edits is expected)
PROGRAMS: dict[str, tuple[str, str, bool]] = {
    # two in-place calls on one line: the written tensor is `b`, the second statement's
    "two_statements_on_a_line": ("a = x * 2\nb = torch.sigmoid(x)\na.mul_(2); b.mul_(3)\n(a + b).sum().backward()\n", "IPD101", False),
    "two_calls_in_one_expression": ("a = x * 2\nb = torch.sigmoid(x)\ny = a.mul_(2) + b.mul_(3)\n(y + b).sum().backward()\n", "IPD101", False),
    # torch.nn.init has no `zeros`/`normal`: no out-of-place twin to offer
    "init_zeros": ("h = torch.sigmoid(x)\nnn.init.zeros_(h)\nh.sum().backward()\n", "IPD101", False),
    "init_normal_qualified": ("h = torch.sigmoid(x)\ntorch.nn.init.normal_(h)\nh.sum().backward()\n", "IPD101", False),
    "method_chain": ("h = torch.sigmoid(x)\nh.add_(1).mul_(2)\nh.sum().backward()\n", "IPD101", False),
    "torch_function": ("h = torch.sigmoid(x)\ntorch.relu_(h)\nh.sum().backward()\n", "IPD101", True),
    "functional_result_used": ("h = torch.sigmoid(x)\ny = F.relu_(h)\n(y * 2).sum().backward()\n", "IPD101", True),
    "string_holding_an_inplace_call": ("h = torch.sigmoid(x)\ny = len('z.relu_(') * h.add_(1)\ny.sum().backward()\n", "IPD101", True),
    # Tensor has no `zero` or `copy` method: `h = h.zero()` would not run
    # no `Tensor.zero`/`Tensor.copy`: a copy before the write (`h = h.clone()`), not a made-up method
    "zero_method": ("h = torch.sigmoid(x)\nh.zero_()\nh.sum().backward()\n", "IPD101", True),
    "copy_method": ("h = torch.sigmoid(x)\nh.copy_(torch.ones(4))\nh.sum().backward()\n", "IPD101", True),
    "data_copy": ("h = torch.sigmoid(x)\nh.data.copy_(torch.ones(4))\nh.sum().backward()\n", "IPD104", False),
    "data_method": ("h = torch.sigmoid(x)\nh.data.mul_(2)\nh.sum().backward()\n", "IPD104", True),
    "augmented": ("h = torch.sigmoid(x)\nh += 1  # shift\nh.sum().backward()\n", "IPD101", True),
    "statement_rebound": ("h = torch.sigmoid(x)\nh.mul_(2)\nh.sum().backward()\n", "IPD101", True),
    "user_function_named_like_an_inplace_op": (
        "def scale_(t):\n    t.mul_(2)\nh = torch.sigmoid(x)\nscale_(h)\nh.sum().backward()\n", "IPD101", True,
    ),
    "flag_at_a_call_read_after": (
        "lin = nn.Linear(4, 4)\nh = lin(x)\nout = F.relu(h, inplace=True) + h\nout.sum().backward()\n", "IPD105", True,
    ),
    "leaf": ("w = torch.randn(3, requires_grad=True)\nw.mul_(2)\n", "IPD102", False),
    # IPD110 (a warning): through `.detach()`, Tensor has no `fill`; alone in a no_grad block
    "detach_fill": ("h = x * 2\nh.detach().fill_(2.0)\n(h * h).sum().backward()\n", "IPD110", False),
    "detach_mul": ("h = x * 2\nh.detach().mul_(3)\n(h * h).sum().backward()\n", "IPD110", True),
    "no_grad_alone": ("h = x * 2\nwith torch.no_grad():\n    h += 1\n(h * h).sum().backward()\n", "IPD110", True),
    # IPD109: memory handed out to NumPy, written there; `a = ...numpy()` in a line with a comment
    "numpy_handout": ("h = torch.sigmoid(x)\na = h.detach().numpy()  # view\na *= 2\nh.sum().backward()\n", "IPD109", True),
    # IPD103: one of several views; the piece's own fix, or none for a chain
    "view_rebound": ("a, b = (x * 1).view(2, 2).unbind(0)\na.mul_(2)\n", "IPD103", True),
    "view_result_used": ("a, b = (x * 1).view(2, 2).unbind(0)\ny = torch.exp(a.clamp_(0, 1))\n", "IPD103", True),
    "view_chain": ("a, b = (x * 1).view(2, 2).unbind(0)\na.mul_(2).add_(1)\n", "IPD103", False),
}

# where the deep tracer could name another op or line than the fast one (several writes on a line)
DEEP_TOO = ("two_statements_on_a_line", "two_calls_in_one_expression", "method_chain", "view_chain", "init_zeros")

_REPLACE = re.compile(r"replace `([^`]*)` with `([^`]*)`")
_INSERT = re.compile(r"insert `([^`]*)` before `([^`]*)`")


def _run(path: Path, **options: object) -> tuple[list[Finding], ipd.Report, str]:
    session = ipd.watch(**options)  # type: ignore[arg-type]
    raised = ""
    try:
        with session:
            runpy.run_path(str(path), run_name="__main__")
    except RuntimeError as e:
        raised = str(e)
    report = session.report()
    return [f for f in report.findings if f.severity is not Severity.INFO], report, raised


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], tuple[Path, list[Finding], ipd.Report, str]]:
    """Every program under the fast tracer, with and without fail_fast, and those of DEEP_TOO under the
    deep one: run once for all the tests."""
    folder = tmp_path_factory.mktemp("fix_english")
    torch.set_num_threads(1)
    out = {}
    for name, (body, _, _) in PROGRAMS.items():
        path = folder / f"{name}.py"
        path.write_text(HEAD + body)
        findings, report, _ = _run(path)
        _, _, raised = _run(path, fail_fast=True)
        out[(name, False)] = (path, findings, report, raised)
        if name in DEEP_TOO:
            findings, report, _ = _run(path, deep=True)
            out[(name, True)] = (path, findings, report, "")
    return out


def _texts(finding: Finding, report: ipd.Report, raised: str) -> list[str]:
    """Every text the user reads about `finding`: its message, the text report, the JSON, the error."""
    stream = io.StringIO()
    text_format.render(report, stream, color=False)
    data = io.StringIO()
    json_format.render(report, data)
    (entry,) = [d for d in json.loads(data.getvalue())["findings"] if d["code"] == finding.code]
    texts = [finding.message, stream.getvalue(), entry["message"], entry["fix"], *(x.get("message", "") for x in entry["fixes"])]
    return [*texts, raised]


def _said_by_an_edit(old: str, new: str, edits: list[Edit]) -> bool:
    """`old` -> `new` is an edit's own text, or the statement an edit lands in and that statement edited."""
    for e in edits:
        if (old, new) == (one_line(e.old), one_line(e.new)):
            return True
        line = Path(e.path).read_text().splitlines()[e.start.line - 1]
        if e.start.line == e.end.line and line[e.start.column : e.end.column] == e.old:
            edited = line[: e.start.column] + e.new + line[e.end.column :]
            if (old, new) == (line.split("#")[0].strip(), edited.split("#")[0].strip()):
                return True
    return False


def _inserted_by_an_edit(code: str, edits: list[Edit]) -> bool:
    return any(not e.old and e.new.strip() == code for e in edits)


@pytest.mark.parametrize(
    ("name", "deep"), [(n, False) for n in sorted(PROGRAMS)] + [(n, True) for n in DEEP_TOO],
    ids=[*sorted(PROGRAMS), *(f"{n}-deep" for n in DEEP_TOO)],
)
def test_every_replacement_the_tool_prints_is_an_edit_built_from_the_source(name: str, deep: bool, runs) -> None:
    path, findings, report, raised = runs[(name, deep)]
    code, has_edit = PROGRAMS[name][1], PROGRAMS[name][2]
    finding = next((f for f in findings if f.code == code), None)
    assert finding is not None, [(f.code, f.fix) for f in findings]
    edits = [e for fix in finding.fixes for e in fix.edits]
    assert bool(edits) is has_edit, finding.fixes
    if deep is False and finding.severity is Severity.ERROR and code != "IPD102":  # IPD102: PyTorch's own error
        assert raised, "watch(fail_fast=True) raised nothing"
    for text in _texts(finding, report, raised):
        for old, new in _REPLACE.findall(text):
            assert _said_by_an_edit(old, new, edits), f"made-up replacement {old!r} -> {new!r} in:\n{text}"
        for inserted, _ in _INSERT.findall(text):
            assert _inserted_by_an_edit(inserted, edits), f"made-up insertion {inserted!r} in:\n{text}"
    assert finding.fix and finding.fix in finding.message


def _apply(edits: list[Edit], path: Path) -> str:
    text = path.read_text()
    lines = text.splitlines(keepends=True)

    def offset(line: int, column: int) -> int:
        return sum(len(x) for x in lines[: line - 1]) + column

    for e in sorted(edits, key=lambda e: e.start, reverse=True):
        assert Path(e.path) == path
        start, end = offset(e.start.line, e.start.column), offset(e.end.line, e.end.column)
        assert text[start:end] == e.old
        text = text[:start] + e.new + text[end:]
    return text


@pytest.mark.parametrize("name", sorted(n for n, (_, _, has_edit) in PROGRAMS.items() if has_edit))
def test_the_first_fixs_edits_give_a_program_that_runs_with_the_finding_gone(name: str, runs, tmp_path: Path) -> None:
    path, findings, _, _ = runs[(name, False)]
    finding = next(f for f in findings if f.code == PROGRAMS[name][1])
    fixed = tmp_path / path.name
    fixed.write_text(_apply(list(finding.fixes[0].edits), path))
    ast.parse(fixed.read_text())
    runpy.run_path(str(fixed), run_name="__main__")  # runs plainly
    after, _, _ = _run(fixed)
    assert [f for f in after if f.code == finding.code] == [], fixed.read_text()


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("two_statements_on_a_line", "`mul`"),
        ("init_zeros", ".clone()"),
        ("leaf", "torch.no_grad()"),
        ("data_copy", ".data"),
    ],
)
def test_a_finding_without_an_edit_still_says_what_to_do(name: str, words: str, runs) -> None:
    """No made-up code, but not nothing: the write's place and what to change there."""
    path, findings, _, _ = runs[(name, False)]
    finding = next(f for f in findings if f.code == PROGRAMS[name][1])
    assert f"{path.name}:" in finding.fix and words in finding.fix, finding.fix
    assert "replace `" not in finding.fix, finding.fix
