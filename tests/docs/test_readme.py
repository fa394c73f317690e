"""The README's shown output is what the README's first command prints (a golden file); the
README stays a front page (issue 39) that links every page of the manual, and every relative
link in the README and docs/*.md leads to a file (and a heading) that exists."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MAX_README_LINES = 450


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


def test_the_readme_opens_with_the_two_commands():
    """Install and audit the bundled example, then install and run the tests: first, before any prose section."""
    readme = (ROOT / "README.md").read_text()
    first = readme.index("```bash\n")
    assert readme.index("inplace-doctor audit inplace_doctor.examples:") > first
    assert readme.index("pip install -q -e '.[test]' && pytest") < readme.index("\n## ")


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move text to docs/ (issue 39)"


def test_the_readme_links_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[^)#\s]+)", readme))
    pages = {f"docs/{p.name}" for p in DOCS.glob("*.md")} | {"docs/rules/README.md"}
    assert pages - linked == set(), "pages of docs/ the README does not link"


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.S | re.M)  # a `# comment` in a block is no heading
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_the_slug_of_a_heading() -> None:
    assert slug("Watch a whole training script: `run`") == "watch-a-whole-training-script-run"
    assert slug("Proving fixes in CI: `run --prove`") == "proving-fixes-in-ci-run---prove"
    assert slug("`inplace.toml`: the in-place flags") == "inplacetoml-the-in-place-flags"


LINKED_DOCS = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=[d.name for d in LINKED_DOCS])
def test_relative_links_resolve(doc: Path) -> None:
    """A moved paragraph's links were rewritten for its new folder: `docs/x.md` in the README is
    `x.md` in docs/, and `../src/...` there; a `#anchor` names a heading of the page it points to."""
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.S | re.M)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            broken.append(target)
    assert broken == [], f"{doc.name}: links to nothing"
