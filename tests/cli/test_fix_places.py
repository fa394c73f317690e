"""One cause at several places (issue 37, item 6): a finding's places are fixed together, proven together.

The textbook discriminator repeats `LeakyReLU(inplace=True)` then `Dropout(inplace=True)`: each
Dropout overwrites what its LeakyReLU saved. The two places fold into one finding (one cause),
and no single flag fixes it: turning one Dropout's flag off leaves the other overwriting. The
finding's flag fix is one `Fix` with an edit per place, which `fix` tries, proves and writes at once.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
import torch.nn as nn
from programs import git_project

import inplace_doctor as ipd
from inplace_doctor.findings import FixKind

DISCRIMINATOR = textwrap.dedent("""
    import torch
    import torch.nn as nn

    torch.manual_seed(0)


    class Discriminator(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(
                nn.Linear(16, 32),
                nn.LeakyReLU(0.2, inplace=True),
                nn.Dropout(0.3, inplace=True),  # <first dropout>
                nn.Linear(32, 32),
                nn.LeakyReLU(0.2, inplace=True),
                nn.Dropout(0.3, inplace=True),  # <second dropout>
                nn.Linear(32, 1),
            )

        def forward(self, x):
            return self.net(x)


    if __name__ == "__main__":
        D = Discriminator()
        opt = torch.optim.SGD(D.parameters(), lr=0.01)
        for step in range(2):
            loss = D(torch.randn(8, 16)).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        print("trained", round(loss.item(), 4))
""")


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(DISCRIMINATOR.splitlines(), 1) if marker in text)


def _discriminator(tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    script.write_text(DISCRIMINATOR)
    return script


def test_the_finding_has_one_flag_fix_with_an_edit_per_place(tmp_path: Path, monkeypatch) -> None:
    spec = importlib.util.spec_from_file_location("discriminator_under_test", _discriminator(tmp_path))
    assert spec is not None and spec.loader is not None
    train = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, train)  # as an imported module is
    spec.loader.exec_module(train)  # the script's class, built from its own file
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    report = ipd.audit(train.Discriminator(), torch.randn(8, 16))
    (f,) = report.findings
    assert f.code == "IPD101" and len(f.places) == 2
    flags = [fx for fx in f.fixes if fx.kind is FixKind.FLAG_OFF_AT_CONSTRUCTOR and fx.edits]
    assert len(flags) == 1  # one fix, not two alternatives
    assert sorted(e.start.line for e in flags[0].edits) == [_line("<first dropout>"), _line("<second dropout>")]
    assert "every place" in str(report) and "\n  or: " not in str(report)


def test_fix_proves_and_writes_both_places(tmp_path: Path) -> None:
    script = git_project(tmp_path, {"train.py": DISCRIMINATOR}) / "train.py"
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 1 and "modified by an inplace operation" in plain.stderr
    done = subprocess.run(
        [sys.executable, "-m", "inplace_doctor", "fix", str(script)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "(proven:" in done.stdout
    fixed = script.read_text().splitlines()
    assert "inplace=False" in fixed[_line("<first dropout>") - 1] and "inplace=False" in fixed[_line("<second dropout>") - 1]
    assert sum("nn.LeakyReLU(0.2, inplace=True)," in line for line in fixed) == 2  # only the Dropouts changed
    after = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert after.returncode == 0 and after.stdout.startswith("trained")


def test_places_built_by_one_line_stay_one_edit() -> None:
    """A helper that builds each block from one constructor line: one edit fixes every place."""

    def block() -> list[nn.Module]:
        return [
            nn.Linear(8, 8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Dropout(0.3, inplace=True),  # <one line builds both>
        ]

    model = nn.Sequential(*block(), *block())
    torch.manual_seed(0)
    (f,) = ipd.audit(model, torch.randn(4, 8)).findings
    flags = [fx for fx in f.fixes if fx.kind is FixKind.FLAG_OFF_AT_CONSTRUCTOR and fx.edits]
    assert len(flags) == 1 and len(f.places) == 2
    assert [e.start.line for e in flags[0].edits] == [_test_line("<one line builds both>")]


def _test_line(marker: str) -> int:
    with open(__file__, encoding="utf-8") as source:
        return next(i for i, text in enumerate(source, 1) if marker in text and "_test_line(" not in text)
