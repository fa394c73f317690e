"""The README's shown output is what the README's first command prints (a golden file)."""

import re
from pathlib import Path

from inplace_doctor.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_readme_audit_output_matches_the_command(capsys, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"&& (inplace-doctor audit \S+)\n", readme).group(1)
    shown = re.search(r"## What the audit above prints\n\n```text\n(.*?)```", readme, re.S).group(1)
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("NO_COLOR", "1")
    code = main(command.split()[1:])
    assert code == 1  # the bundled example has a real finding
    assert capsys.readouterr().out == shown


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    assert len(commands) >= 2 and "pytest" in commands[1]
    assert commands[1] in (ROOT / ".ci" / "run").read_text().splitlines()
