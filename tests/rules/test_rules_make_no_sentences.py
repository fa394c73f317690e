"""A rule is its decision: no module of rules/ words a finding, and every cause has its words.

`make_finding` in rules/ gets a cause, facts, sites and fixes, never `what`/`why`/`fix`
sentences; render/explain/ has one explainer for each (rule, cause) a rule can decide on.
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

# Rule modules whose sentences are still made in the rule (the old path), until moved to render/explain/.
NOT_YET_MOVED = {"saved_tensors.py"}


def _sentences_given(path: Path) -> list[str]:
    """`file:line keyword` for each `make_finding(...)` call given a sentence."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "make_finding":
            out += [f"{path.name}:{node.lineno} {kw.arg}" for kw in node.keywords if kw.arg in SENTENCES]
    return out


def test_no_rule_module_gives_make_finding_a_sentence() -> None:
    given = [s for p in sorted(RULES_DIR.glob("*.py")) if p.name not in NOT_YET_MOVED for s in _sentences_given(p)]
    assert given == [], "rules decide, render/explain/ words: " + ", ".join(given)


def test_the_check_finds_a_sentence() -> None:
    assert _sentences_given(RULES_DIR / "saved_tensors.py"), "the AST check no longer sees sentences in the old path"


def test_every_cause_has_an_explainer_and_every_explainer_a_rule() -> None:
    pairs = explained_pairs()
    assert {code for code, _ in pairs} <= set(RULES)
    moved = {cause for _, cause in pairs}
    enums = [e for e in typing.get_args(Cause) if not any(m in moved for m in e) and e.__doc__]
    pending = {e.__name__ for e in enums}
    # the enums of rules still on the old path; each moved rule takes its enum off this list
    assert pending == {
        "SavedTensorCause", "SilentOverwriteCause",
    }
    for enum in typing.get_args(Cause):
        if enum.__name__ not in pending:
            missing = [m for m in enum if m not in moved]
            assert not missing, f"{enum.__name__}: no explainer for {missing}"
