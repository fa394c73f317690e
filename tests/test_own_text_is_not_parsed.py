"""No regular expression of the package reads the tool's own words (docs/architecture.md,
"Decisions are records; English is made last").

Decisions are made on fields; a sentence is made last and nothing reads it back. Two guards:
every module that imports `re` is listed here with the text it reads (the user's source,
PyTorch's messages, a path or shape the user typed), so a new one is looked at; and no
pattern call anywhere is handed a finding's or a note's text (`what`, `why`, `fix`,
`message`, `notes`, ...) or a child process's output.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "inplace_doctor"

# module -> the text its patterns read (none of it the tool's own finding or note text)
READS = {
    "trace/places/nodes.py": "PyTorch's error message for a custom Function's gradient",
    "trace/places/stacks.py": "the user's source line a traceback ends on",
    "render/sarif.py": "rule docstrings (their ``literals``), made into SARIF's markdown help",
    "rules/inplace_on_leaf.py": "PyTorch's error message for a leaf written in place",
    "render/explain/caller_data.py": "the user's source line that took a state_dict()",
    "trace/raised/pytorch_errors.py": "an autograd node's class name (`ExpBackward0`), worded as PyTorch's own stale-tensor message words it",
    "trace/fast/fast_writes.py": "an autograd node's class name (`AddmmBackward0`), for the op that saved",
    "rules/saved_tensors.py": "PyTorch's error message for a stale saved tensor",
    "rules/forbidden_inplace.py": "PyTorch's error messages for forbidden in-place writes",
    "render/explain/forbidden_inplace.py": "PyTorch's error message naming the custom Function whose output was written",
    "rules/suppress.py": "`# inplace-doctor: ignore[...]` comments in the user's source",
    "cli/model.py": "an --input shape the user typed",
    "cli/output.py": "an output path the user typed (/dev/stdout, /proc/self/fd/N)",
    "cli/provenance.py": "a file the user named for --output, to tell an earlier report of the tool's from the user's own file",
}

OWN_TEXT = {
    "what", "why", "fix", "message", "notes", "note", "unconfirmed_reason", "fix_alternatives", "title",
    "description", "ended", "first_difference", "described", "stderr", "stdout",
}
PATTERN_CALLS = {"search", "match", "fullmatch", "sub", "subn", "findall", "finditer", "split"}


def _modules() -> list[tuple[str, ast.Module]]:
    return [(p.relative_to(SRC).as_posix(), ast.parse(p.read_text(encoding="utf-8"))) for p in sorted(SRC.rglob("*.py"))]


def _imports_re(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "re" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "re":
            return True
    return False


def _names_in(node: ast.AST) -> set[str]:
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute):
            names.add(sub.attr)
        elif isinstance(sub, ast.Name):
            names.add(sub.id)
        elif isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Constant) and isinstance(sub.slice.value, str):
            names.add(sub.slice.value)
    return names


def test_every_module_that_uses_regular_expressions_says_what_text_it_reads() -> None:
    using = {name for name, tree in _modules() if _imports_re(tree)}
    assert using == set(READS), (
        f"new: {sorted(using - set(READS))}, gone: {sorted(set(READS) - using)}; a pattern may read the user's "
        "source, PyTorch's messages or what the user typed, never the tool's own finding or note text"
    )


def test_no_pattern_is_handed_a_findings_or_a_notes_text() -> None:
    offences = []
    for name, tree in _modules():
        if not _imports_re(tree):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PATTERN_CALLS:
                receiver = node.func.value
                if isinstance(receiver, ast.Constant):  # "a,b".split(","): not a pattern
                    continue
                text = node.args[1] if isinstance(receiver, ast.Name) and receiver.id == "re" and len(node.args) > 1 else (
                    node.args[0] if node.args else None)
                if isinstance(receiver, ast.Name) and receiver.id == "re" and node.func.attr == "sub":
                    text = node.args[2] if len(node.args) > 2 else None
                if text is not None and _names_in(text) & OWN_TEXT:
                    offences.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert offences == []
