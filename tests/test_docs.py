"""Documentation that cannot drift: the rule reference is regenerated and compared."""

from __future__ import annotations

from pathlib import Path

from inplace_doctor.rules import RULES
from inplace_doctor.rules.reference import main, pages, stale

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_rule_reference_is_up_to_date() -> None:
    assert stale(DOCS / "rules") == [], "run: python -m inplace_doctor.rules.reference"
    assert main(["--check", "--out", str(DOCS / "rules")]) == 0


def test_every_rule_page_has_an_example_and_a_fix() -> None:
    generated = pages()
    for code in RULES:
        text = generated[f"{code}.md"]
        assert "```python" in text and "Fix:" in text, code


def test_the_check_notices_a_stale_page(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path)]) == 0 and main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "IPD101.md").write_text("old\n")
    (tmp_path / "IPD999.md").write_text("gone\n")
    assert sorted(stale(tmp_path)) == ["IPD101.md", "IPD999.md"]
    assert main(["--check", "--out", str(tmp_path)]) == 1


# -- every console example in docs/*.md runs and prints what is shown ------------------

import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = DOCS.parent


def console_examples() -> list[tuple[str, str, str]]:
    """(doc name, command, expected output) for each `$ ` line of a ```console block."""
    out = []
    for doc in sorted(DOCS.glob("*.md")):
        for block in re.findall(r"```console\n(.*?)```", doc.read_text(), re.S):
            command, expected = None, []
            for line in block.splitlines():
                if line.startswith("$ "):
                    if command is not None:
                        out.append((doc.name, command, "\n".join(expected)))
                    command, expected = line[2:], []
                else:
                    expected.append(line)
            if command is not None:
                out.append((doc.name, command, "\n".join(expected)))
    return out


def matches(expected: str, actual: str) -> bool:
    """`...` alone on a line: any lines (possibly none); `...` inside a line: any text."""
    parts = []
    for line in expected.rstrip("\n").splitlines():
        if line.strip() == "...":
            parts.append(r"(?:.*\n)*?")
        else:
            parts.append(".*?".join(re.escape(p) for p in line.split("...")) + r"\n")
    return re.fullmatch("".join(parts), actual.rstrip("\n") + "\n", re.S) is not None


EXAMPLES = console_examples()


def test_the_docs_have_console_examples() -> None:
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("doc,command,expected", EXAMPLES, ids=[c for _, c, _ in EXAMPLES])
def test_console_example_output_matches(doc: str, command: str, expected: str) -> None:
    argv = shlex.split(command)
    assert argv[0] == "inplace-doctor", "examples run the tool itself"
    created = [ROOT / a for a in argv if a.endswith(".toml") and not (ROOT / a).exists()]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "inplace_doctor", *argv[1:]], capture_output=True, text=True, cwd=ROOT,
            env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}, timeout=600,
        )
    finally:
        for path in created:
            path.unlink(missing_ok=True)
    actual = done.stdout + done.stderr
    assert matches(expected, actual), f"{doc}: `{command}` printed:\n{actual}"


def test_the_ellipsis_matcher() -> None:
    assert matches("a\n...\nd", "a\nb\nc\nd\n") and matches("a ... c", "a b c") and matches("a\n...\nb", "a\nb")
    assert not matches("a\nd", "a\nb\nd") and not matches("x ... z", "x y")
