"""A rule is its decision: no module of rules/ words a finding, and every cause has its words.

`make_finding` in rules/ gets a cause, facts, sites and fixes, never `what`/`why`/`fix`
sentences; render/explain/ has one explainer for each cause a rule can decide on.
"""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import inplace_doctor  # noqa: F401  (registers the explainers, as any use of the package does)
from inplace_doctor.causes import Cause
from inplace_doctor.explanations import explained_pairs
from inplace_doctor.rules import RULES

RULES_DIR = Path(inplace_doctor.__file__).resolve().parent / "rules"
SENTENCES = ("what", "why", "fix")


def _sentences_given(source: str, name: str) -> list[str]:
    """`name:line keyword` for each `make_finding(...)` call given a sentence."""
    out = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "make_finding":
            out += [f"{name}:{node.lineno} {kw.arg}" for kw in node.keywords if kw.arg in SENTENCES]
    return out


def test_no_rule_module_gives_make_finding_a_sentence() -> None:
    given = [s for p in sorted(RULES_DIR.glob("*.py")) for s in _sentences_given(p.read_text(), p.name)]
    assert given == [], "rules decide, render/explain/ words: " + ", ".join(given)


def test_the_check_finds_a_sentence() -> None:
    old = 'return make_finding("IPD102", cause=cause, what=f"{where(site, label)} modifies", mutation=site)'
    assert _sentences_given(old, "old.py") == ["old.py:1 what"]


def test_every_cause_has_an_explainer_and_every_explainer_a_rule() -> None:
    pairs = explained_pairs()
    assert {code for code, _ in pairs} <= set(RULES)
    explained = {cause for _, cause in pairs}
    missing = [f"{type(m).__name__}.{m.name}" for enum in typing.get_args(Cause) for m in enum if m not in explained]
    assert missing == [], "causes without an explainer in render/explain/: " + ", ".join(missing)


def test_importing_any_module_of_the_package_registers_every_explainer() -> None:
    """Python imports the package's `__init__` (which imports render/) before any of its modules,
    so a rule can never run without its words: checked from a fresh interpreter that imports the
    seam alone."""
    import subprocess
    import sys

    code = "from inplace_doctor.explanations import explained_pairs; print(len(explained_pairs()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(explained_pairs())
