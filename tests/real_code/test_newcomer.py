"""The guide's "fix a broken training script" path, done as a newcomer would: run the script under
the tool, make the edit its fix names, run it again.

The other two first tasks (audit a torchvision model, write an inplace.toml) are console examples
in docs/guide.md, run as written by tests/docs/test_docs.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIX = re.compile(r"fix: write into a copy \(`(?P<stmt>[^`]+)` before `(?P<before>[^`]+)`\).* at (?P<file>\S+):(?P<line>\d+)")


def _run(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inplace_doctor", *argv], cwd=cwd, text=True, timeout=300,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
    )


def test_the_fix_the_tool_names_makes_the_script_train(tmp_path: Path) -> None:
    shutil.copy(ROOT / "examples" / "broken_train.py", tmp_path / "train.py")
    broken = _run(tmp_path, "run", "train.py")
    assert broken.returncode == 1, broken.stdout
    assert "final loss" not in broken.stdout and "IPD101" in broken.stdout
    match = FIX.search(broken.stdout)
    assert match, broken.stdout
    assert match["file"] == "train.py"

    lines = (tmp_path / "train.py").read_text().splitlines(keepends=True)
    target = lines[int(match["line"]) - 1]
    assert target.strip().startswith(match["before"]), (target, match["before"])
    indent = target[: len(target) - len(target.lstrip())]
    lines.insert(int(match["line"]) - 1, f"{indent}{match['stmt']}\n")
    (tmp_path / "train.py").write_text("".join(lines))

    fixed = _run(tmp_path, "run", "train.py")
    assert fixed.returncode == 0, fixed.stdout
    assert "final loss" in fixed.stdout and "inplace-doctor: 0 finding(s); watched 20 optimizer steps" in fixed.stdout
    plain = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0 and plain.stdout.strip() in fixed.stdout  # the tool changed nothing it observed
