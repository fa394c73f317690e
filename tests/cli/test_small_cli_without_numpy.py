"""Without numpy, the README's first command prints the report first, not torch's NumPy warning (issue 13).

`import torch` itself warns "Failed to initialize NumPy" when numpy is missing. numpy is hidden
here by a `numpy` package on PYTHONPATH that raises ModuleNotFoundError, as a missing one does
(torch catches exactly that).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WARNING = "Failed to initialize NumPy"


def _env_without_numpy(tmp_path: Path) -> dict[str, str]:
    fake = tmp_path / "numpy"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n")
    env = dict(os.environ, NO_COLOR="1")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env.pop("PYTHONWARNINGS", None)
    return env


def _console_script() -> tuple[str, str]:
    """(module, function) of the `inplace-doctor` command, as pyproject.toml declares it."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, function = scripts["inplace-doctor"].split(":")
    return module, function


def test_the_cli_prints_the_report_first_without_numpy(tmp_path: Path) -> None:
    env = _env_without_numpy(tmp_path)
    plain = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True, cwd=ROOT)
    if WARNING not in plain.stderr:
        pytest.skip(f"this torch does not warn at import without numpy: {plain.stderr[-300:]!r}")
    module, function = _console_script()
    # What the installed `inplace-doctor` script runs.
    launcher = f"import sys; sys.argv[0] = 'inplace-doctor'; from {module} import {function}; sys.exit({function}())"
    done = subprocess.run(
        [sys.executable, "-c", launcher, "audit", "inplace_doctor.examples:sigmoid_then_relu"],
        env=env, capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert WARNING not in done.stderr, done.stderr
    assert done.returncode == 1, done.stderr  # the bundled example has a real finding
    assert done.stdout.startswith("inplace-doctor audit of inplace_doctor.examples:sigmoid_then_relu"), done.stdout
