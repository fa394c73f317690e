"""The code passes ruff's lint as `pyproject.toml` configures it (`[tool.ruff]`)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    found = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("ruff is not installed (pip install ruff)")
    return [found]


def test_ruff_lint_is_clean():
    done = subprocess.run(
        [*_ruff(), "check", "--no-cache", "--output-format", "concise", "src", "tests", "tools", "benchmarks"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
