"""The README's shown output is what the README's first command prints (a golden file)."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_audit_output_matches_the_command():
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"&& (inplace-doctor audit \S+)\n", readme).group(1)
    shown = re.search(r"## What the audit above prints\n\n```text\n(.*?)```", readme, re.S).group(1)
    # As the command runs: in its own process (run in-process, this test's frames would be user code).
    done = subprocess.run(
        [sys.executable, "-m", "inplace_doctor", *command.split()[1:]], capture_output=True, text=True,
        cwd=ROOT, timeout=300, env={**os.environ, "NO_COLOR": "1"},
    )
    assert done.returncode == 1, done.stderr  # the bundled example has a real finding
    assert done.stdout == shown


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    assert len(commands) >= 2 and "pytest" in commands[1]
    assert commands[1] in (ROOT / ".ci" / "run").read_text().splitlines()
