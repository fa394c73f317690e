"""A finding is its line, not its line's text (issue 38, item 6).

`fix` names a finding across runs of differently edited copies by its rule, file, the
written line's text and which line that is, followed back through the edits made
(`prove.identity`, `edited_lines.origins`). Two modules whose forwards both read
`h.mul_(2)` are two findings: fixing one leaves the other, which is not the one
fixed "still there"; and where only one of two identical lines has a finding, only
that one is edited.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from programs import git_project

from inplace_doctor.cli.proof.edited_lines import followed, origins
from inplace_doctor.cli.proof.prove import Identity, identity
from inplace_doctor.findings import Finding, Severity
from inplace_doctor.sites import Site

MODULE = """\
class {name}(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = {made}
        h.mul_(2)
        return h

"""
SAVED = "torch.sigmoid(self.lin(x))"  # sigmoid saves its output: the write overwrites it
UNSAVED = "self.lin(x) + 1"  # nothing saves the sum: the same write is harmless here
TRAIN = textwrap.dedent(
    """\
    torch.manual_seed(0)
    model = nn.Sequential(A(), B())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    print(model[0].lin.weight.sum().item())
    """
)


def program(a: str, b: str) -> str:
    return ("import torch\nfrom torch import nn\n\n\n" + MODULE.format(name="A", made=a) + "\n"
            + MODULE.format(name="B", made=b) + "\n" + TRAIN)


def fix(project: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inplace_doctor", "fix", "train.py"], cwd=project,
                          capture_output=True, text=True, timeout=900)


def lines_with(text: str, needle: str) -> list[int]:
    return [n for n, line in enumerate(text.splitlines(), 1) if line.strip() == needle]


@pytest.mark.slow
def test_two_modules_with_the_same_write_line_get_both_fixed_each_proven(tmp_path: Path) -> None:
    source = program(SAVED, SAVED)
    a, b = lines_with(source, "h.mul_(2)")
    project = git_project(tmp_path, {"train.py": source})
    done = fix(project)
    assert done.returncode == 0, done.stdout + done.stderr
    for line in (a, b):  # each one fixed, proven, named at its own line
        assert f"fixed IPD101 at train.py:{line}: replace `h.mul_(2)` with `h = h.mul(2)`" in done.stdout, done.stdout
    assert "still has the finding" not in done.stdout
    written = (project / "train.py").read_text()
    assert written == source.replace("h.mul_(2)", "h = h.mul(2)")
    assert subprocess.run([sys.executable, "train.py"], cwd=project, capture_output=True).returncode == 0


@pytest.mark.slow
def test_of_two_identical_lines_only_the_one_with_the_finding_is_fixed(tmp_path: Path) -> None:
    source = program(SAVED, UNSAVED)
    a, b = lines_with(source, "h.mul_(2)")
    project = git_project(tmp_path, {"train.py": source})
    done = fix(project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"fixed IPD101 at train.py:{a}:" in done.stdout and f"train.py:{b}" not in done.stdout, done.stdout
    written = (project / "train.py").read_text().splitlines()
    assert written[a - 1].strip() == "h = h.mul(2)" and written[b - 1].strip() == "h.mul_(2)"


def test_lines_are_followed_back_through_inserted_rewritten_and_moved_lines() -> None:
    old = ["a", "h.mul_(2)", "b", "h.mul_(2)", "c", "step()", "d"]
    new = ["a", "h = h.clone()", "h.mul_(2)", "b", "h = h.mul(2)", "c", "d", "step()"]
    # inserted: 0; shifted by the insertion: its old line; rewritten in place: the line it was; moved: too
    assert followed(old, new) == (1, 0, 2, 3, 4, 5, 7, 6)


def test_a_finding_is_named_by_the_line_it_had_before_the_edits(tmp_path: Path) -> None:
    before = b"import torch\nh = torch.ones(2)\nh.mul_(2)\ng = h\nh.mul_(2)\n"
    after = before.replace(b"h = torch.ones(2)\n", b"h = torch.ones(2)\nh = h.clone()\n")
    path = tmp_path / "m.py"
    lines = origins({str(path): after}, {str(path): before}.get, str(tmp_path))
    assert list(lines) == ["m.py"] and lines["m.py"][:6] == (1, 2, 0, 3, 4, 5)

    def at(line: int) -> Finding:
        site = Site(op="aten.mul_", file=str(tmp_path / "m.py"), line=line, code="h.mul_(2)")
        return Finding(code="IPD101", severity=Severity.ERROR, title="t", mutation=site)

    # in the edited file the writes are at lines 4 and 6: the program's lines 3 and 5, two findings
    assert identity(at(4), str(tmp_path), lines) == Identity("IPD101", "m.py", "h.mul_(2)", 3) == identity(at(3), str(tmp_path))
    assert identity(at(6), str(tmp_path), lines) == identity(at(5), str(tmp_path)) != identity(at(3), str(tmp_path))
