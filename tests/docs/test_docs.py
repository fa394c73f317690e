"""Documentation that cannot drift: the rule reference is regenerated and compared."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from inplace_doctor.rules import RULES

DOCS = Path(__file__).resolve().parents[2] / "docs"
# The checkout's developer tool (not in the wheel), loaded by its path.
_spec = importlib.util.spec_from_file_location("rule_reference", DOCS.parent / "tools" / "rule_reference.py")
rule_reference = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(rule_reference)  # type: ignore[union-attr]
main, pages, stale = rule_reference.main, rule_reference.pages, rule_reference.stale


def test_rule_reference_is_up_to_date() -> None:
    assert stale(DOCS / "rules") == [], "run: python tools/rule_reference.py"
    assert main(["--check", "--out", str(DOCS / "rules")]) == 0


def test_every_rule_page_has_an_example_and_a_fix() -> None:
    generated = pages()
    for code in RULES:
        text = generated[f"{code}.md"]
        assert "```python" in text and "Fix:" in text, code


@pytest.mark.parametrize("code", sorted(RULES))
def test_every_rule_page_example_is_reported_by_its_rule(code: str, tmp_path: Path, monkeypatch) -> None:
    """The page's minimal example, run as printed under `ipd.watch()`, is flagged with the page's code."""
    import torch
    import torchvision
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    import inplace_doctor as ipd

    monkeypatch.chdir(tmp_path)
    (example,) = re.findall(r"```python\n(.*?)```", pages()[f"{code}.md"], re.S)
    namespace = {"torch": torch, "torchvision": torchvision, "nn": nn, "checkpoint": checkpoint}
    torch.manual_seed(0)
    try:
        with ipd.watch() as session:
            exec(compile(example, f"{code} example", "exec"), namespace)
    except ipd.InplaceError:
        pass  # the example's point, for the rules whose PyTorch error is the symptom
    assert code in [f.code for f in session.findings], example


def test_the_check_notices_a_stale_page(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path)]) == 0 and main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "IPD101.md").write_text("old\n")
    (tmp_path / "IPD999.md").write_text("gone\n")
    assert sorted(stale(tmp_path)) == ["IPD101.md", "IPD999.md"]
    assert main(["--check", "--out", str(tmp_path)]) == 1


# -- every console example in docs/*.md runs and prints what is shown ------------------



ROOT = DOCS.parent


def console_examples() -> list[tuple[str, list[tuple[str, str]]]]:
    """(doc name, [(command, expected output), ...]) for each ```console block: its `$ ` lines
    run in order (a file one command writes is there for the next)."""
    out = []
    for doc in sorted(DOCS.glob("*.md")):
        for block in re.findall(r"```console\n(.*?)```", doc.read_text(), re.S):
            steps: list[tuple[str, list[str]]] = []
            for line in block.splitlines():
                if line.startswith("$ "):
                    steps.append((line[2:], []))
                elif steps:
                    steps[-1][1].append(line)
            out.append((doc.name, [(command, "\n".join(expected)) for command, expected in steps]))
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
    assert sum(len(steps) for _, steps in EXAMPLES) >= 4


@pytest.mark.parametrize("doc,steps", EXAMPLES, ids=[steps[0][0] for _, steps in EXAMPLES])
def test_console_example_output_matches(doc: str, steps: list[tuple[str, str]]) -> None:
    """Run as a user would see it: stdout and stderr interleaved, unbuffered; `.toml` files the
    block creates are removed afterwards."""
    created = []
    try:
        for command, expected in steps:
            argv = shlex.split(command)
            assert argv[0] == "inplace-doctor", "examples run the tool itself"
            created += [ROOT / a for a in argv if a.endswith(".toml") and not (ROOT / a).exists()]
            done = subprocess.run(
                [sys.executable, "-m", "inplace_doctor", *argv[1:]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, cwd=ROOT, timeout=600,
                env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200", "PYTHONUNBUFFERED": "1"},
            )
            assert matches(expected, done.stdout), f"{doc}: `{command}` printed:\n{done.stdout}"
    finally:
        for path in created:
            path.unlink(missing_ok=True)


def test_the_ellipsis_matcher() -> None:
    assert matches("a\n...\nd", "a\nb\nc\nd\n") and matches("a ... c", "a b c") and matches("a\n...\nb", "a\nb")
    assert not matches("a\nd", "a\nb\nd") and not matches("x ... z", "x y")


# -- every Python and TOML example in README.md and docs/*.md runs (or parses) ------------


DOCUMENTS = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def fenced(doc: Path, lang: str) -> list[tuple[str, str]]:
    """(the text before the block, the block) for each ```lang block, indented ones included."""
    text = doc.read_text()
    out = []
    for m in re.finditer(rf"^( *)```{lang}\n(.*?)^\1```", text, re.S | re.M):
        out.append((text[: m.start()], textwrap.dedent(m.group(2))))
    return out


def _excerpt_source(before: str) -> Path | None:
    m = re.search(r"excerpt of `([^`]+)`:\s*$", before)
    return ROOT / m.group(1) if m else None


PY_DOCS = [d for d in DOCUMENTS if fenced(d, "python")]


def test_the_docs_have_python_examples() -> None:
    assert ROOT / "README.md" in PY_DOCS


def test_the_examples_moved_out_of_the_readme_are_still_run() -> None:
    """Issue 39 moved the README's memory, Lightning, Hugging Face and pytest examples and its TOML
    configs to docs/: each is still a block that `test_python_examples_run` runs (or checks as an
    excerpt) and `test_toml_examples_are_valid_configs` reads, in the page that now holds it."""
    memory = [code for _, code in fenced(DOCS / "memory.md", "python")]
    assert any("ipd.memory(" in code and "ipd.optimize(" in code for code in memory)
    integrations = fenced(DOCS / "integrations.md", "python")
    assert any("InplaceDoctorCallback" in code and "lightning" in code for _, code in integrations)
    assert any("InplaceDoctorCallback" in code and "transformers" in code for _, code in integrations)
    assert any(_excerpt_source(before) == ROOT / "examples/pytest/test_model_inplace.py" for before, _ in integrations)
    for doc in (ROOT / "README.md", DOCS / "configuration.md"):
        assert any("[tool.inplace-doctor]" in block for _, block in fenced(doc, "toml")), doc.name
    assert any("[inplace]" in block for _, block in fenced(DOCS / "configuration.md", "toml"))


@pytest.mark.parametrize("doc", PY_DOCS, ids=[d.name for d in PY_DOCS])
def test_python_examples_run(doc: Path, tmp_path: Path, monkeypatch) -> None:
    """A document's blocks run in order in one namespace, like a notebook, in an empty
    directory; a block marked as an excerpt of a file must be one (its lines, in order)."""
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__doc_example__"}
    ran = 0
    for before, code in fenced(doc, "python"):
        source = _excerpt_source(before)
        if source is not None:
            lines = [line.strip() for line in source.read_text().splitlines()]
            pos = 0
            for line in (x.strip() for x in code.splitlines()):
                if not line or line == "...":
                    continue
                assert line in lines[pos:], f"{doc.name}: {line!r} is not in {source.name} (in order)"
                pos = lines.index(line, pos) + 1
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"{doc.name} example", "exec"), namespace)
        ran += 1
    assert ran or doc.name != "README.md"


def test_the_readme_python_example_prints_both_culprits(tmp_path: Path, monkeypatch) -> None:
    """Not only does it run: it shows what the comments say (the finding, then the watch error)."""
    monkeypatch.chdir(tmp_path)
    before, code = fenced(ROOT / "README.md", "python")[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md example", "exec"), {"__name__": "__doc_example__"})
    printed = out.getvalue()
    assert "IPD101" in printed and "examples/__init__.py:22" in printed and "examples/__init__.py:21" in printed
    assert "overwrote a [4, 8] float32 tensor, which `SigmoidBackward0.result` saved" in printed  # the watch error
    assert printed.rstrip().endswith("['IPD101']")


@pytest.mark.parametrize("doc", DOCUMENTS, ids=[d.name for d in DOCUMENTS])
def test_toml_examples_are_valid_configs(doc: Path, tmp_path: Path) -> None:
    from inplace_doctor.cli.project import load_project_config
    from inplace_doctor.engines.optimize.toml_config import load_config

    for _, block in fenced(doc, "toml"):
        if "[tool.inplace-doctor]" in block:
            (tmp_path / "pyproject.toml").write_text(block)
            config = load_project_config(tmp_path)
            assert config.ignore, f"{doc.name}: the example's settings were not read"
        elif "[inplace]" in block:
            (tmp_path / "inplace.toml").write_text(block)
            table, _ = load_config(tmp_path / "inplace.toml")
            assert table, f"{doc.name}: empty [inplace] example"
