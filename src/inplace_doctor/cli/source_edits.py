"""The source edits `inplace-doctor fix` can make, read from a finding's fix and applied with libcst.

Four fix templates are edits whose meaning is known (each is applied to its
program and compared with the intended one in tests/rules/test_fixes.py):
- `insert `h = h.clone()` before `STATEMENT``: the write then lands on a copy
  the name refers to from there on, and autograd keeps the saved original;
- `replace `x += y` with `x = x + y`` (x a plain name): the result is a new
  tensor bound to the same name, the old object (saved, or read elsewhere)
  keeps its values; on an attribute (`self.w += d`) it would rebind a
  Parameter to a plain tensor, so that one is a suggestion;
- `replace `x.relu_()` with `x = x.relu()`` (the statement alone, x a plain
  name): the same, for an in-place method whose effect is the mutation;
- `construct `model.act` with inplace=False at FILE:LINE`, and `pass
  inplace=False` to a functional call (`F.relu(h, inplace=True)`): the module
  or call computes out of place, the program PyTorch's in-place check holds the
  in-place one to; `fix` then runs `run --verify` to prove each model the
  script runs computes exactly what its out-of-place form does.
Every other fix is shown, not applied. libcst keeps formatting and comments.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import InplaceDoctorError

_AT = r" at (?P<file>\S+?):(?P<line>\d+)"
_CLONE = re.compile(r"`(?P<name>[A-Za-z_]\w*) = (?P=name)\.clone\(\)` before `(?P<stmt>[^`]+)`")
_AUGMENTED = re.compile(r"replace `(?P<old>[^`]+?\s*(?:\+|-|\*|/|//|@|%|\*\*|&|\||\^)=[^`]+)` with `(?P<new>[^`]+)`" + _AT)
_FLAG = re.compile(r"construct `[^`]+` with inplace=False" + _AT)
_REBIND = re.compile(
    r"rebind the name: replace `(?P<old>(?P<name>[A-Za-z_]\w*)\.[a-z][a-z0-9_]*_\([^`]*\))` "
    r"with `(?P<new>(?P=name) = [^`]+)`" + _AT
)
_CALL_FLAG = re.compile(r"pass inplace=False: replace `(?P<old>[^`]+)` with `[^`]+`" + _AT)
_NAME = re.compile(r"[A-Za-z_]\w*")
_ANY_AT = re.compile(_AT)


@dataclass(frozen=True)
class Edit:
    """One change to one line of one file: what `fix` applies, and how it says so."""

    kind: str  # "clone", "augmented", "rebind", "flag" (a constructor), "argument" (a functional call)
    file: str  # as the finding names it (relative to the working directory, or absolute)
    line: int
    old: str  # the statement (or call) as it reads now
    new: str  # the statement to insert, the replacement, or "inplace=False"
    code: str  # the finding's rule code

    def describe(self) -> str:
        where = f"{self.file}:{self.line}"
        if self.kind == "clone":
            return f"{self.code}: insert `{self.new}` before `{self.old}` at {where}"
        if self.kind in ("augmented", "rebind"):
            return f"{self.code}: replace `{self.old}` with `{self.new}` at {where}"
        if self.kind == "argument":
            return f"{self.code}: pass inplace=False at {where} (`{self.old}`)"
        return f"{self.code}: construct with inplace=False at {where} (`{self.old}`)"


def edit_for(finding: dict[str, Any]) -> Edit | None:
    """The edit a finding's fix names, if it is one of the three templates; else None (a suggestion)."""
    fix, code = finding.get("fix") or "", finding.get("code", "")
    at = _ANY_AT.search(fix)
    if at is None:
        return None
    file, line = at["file"], int(at["line"])
    if (m := _CLONE.search(fix)) is not None:
        return Edit("clone", file, line, m["stmt"], f"{m['name']} = {m['name']}.clone()", code)
    if (m := _AUGMENTED.search(fix)) is not None:
        if not _NAME.fullmatch(m["new"].split("=", 1)[0].strip()):
            return None  # `self.w += d` -> `self.w = self.w + d` would assign a tensor over a Parameter
        return Edit("augmented", m["file"], int(m["line"]), m["old"], m["new"], code)
    if (m := _REBIND.search(fix)) is not None:
        return Edit("rebind", m["file"], int(m["line"]), m["old"], m["new"], code)
    if (m := _FLAG.search(fix)) is not None:
        return Edit("flag", m["file"], int(m["line"]), _quoted_after(fix, m.end()), "inplace=False", code)
    if (m := _CALL_FLAG.search(fix)) is not None:
        return Edit("argument", m["file"], int(m["line"]), m["old"], "inplace=False", code)
    return None


def _quoted_after(text: str, start: int) -> str:
    found = re.compile(r"\(`(?P<code>[^`]+)`\)").search(text, start)
    return found["code"] if found else ""


class EditError(InplaceDoctorError):
    """An edit that does not match the file as it reads now (changed since the run); `fix` turns it
    into its one usage line."""


def apply_edits(source: str, edits: Sequence[Edit]) -> str:
    """`source` with every edit made; raises EditError when an edit's line no longer reads as it did."""
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider

    wrapper = MetadataWrapper(cst.parse_module(source))
    transformer = _Transformer(list(edits), wrapper.resolve(PositionProvider), cst)
    module = wrapper.visit(transformer)
    missed = [e for e in edits if e not in transformer.done]
    if missed:
        raise EditError("; ".join(f"{e.file}:{e.line} no longer reads `{e.old}`" for e in missed))
    return str(module.code)


def _Transformer(edits: list[Edit], positions: Any, cst: Any) -> Any:
    """A libcst transformer making `edits` (built here so libcst is imported only by `fix`)."""

    class Transformer(cst.CSTTransformer):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.done: list[Edit] = []

        def _line(self, node: Any) -> int:
            return int(positions[node].start.line)

        def leave_IndentedBlock(self, original: Any, updated: Any) -> Any:
            return updated.with_changes(body=self._body_from(original, updated))

        def leave_Module(self, original: Any, updated: Any) -> Any:
            return updated.with_changes(body=self._body_from(original, updated))

        def _body_from(self, original: Any, updated: Any) -> list[Any]:
            # positions are known for the original nodes: match on them, keep the updated ones
            lines = {i: (self._line(o) if o in positions else -1) for i, o in enumerate(original.body)}
            out: list[Any] = []
            for i, stmt in enumerate(updated.body):
                for edit in edits:
                    if edit.kind == "clone" and edit.line == lines[i] and edit.old.strip() in _code(original.body[i], cst):
                        out.append(cst.parse_statement(edit.new + "\n"))
                        self.done.append(edit)
                out.append(stmt)
            return out

        def leave_AugAssign(self, original: Any, updated: Any) -> Any:
            return self._replace_statement("augmented", original, updated)

        def leave_Expr(self, original: Any, updated: Any) -> Any:
            return self._replace_statement("rebind", original, updated)

        def _replace_statement(self, kind: str, original: Any, updated: Any) -> Any:
            """The small statement an edit of `kind` names at its line, replaced by the edit's new one."""
            line = self._line(original)
            for edit in edits:
                if edit.kind == kind and edit.line == line and _same(_code(original, cst), edit.old):
                    self.done.append(edit)
                    return cst.parse_statement(edit.new + "\n").body[0]
            return updated

        def leave_Call(self, original: Any, updated: Any) -> Any:
            line = self._line(original)
            for edit in edits:
                if edit.kind not in ("flag", "argument") or edit.line != line:
                    continue
                args = list(updated.args)
                for i, arg in enumerate(args):
                    if arg.keyword is not None and arg.keyword.value == "inplace" and _is_true(arg.value, cst):
                        args[i] = arg.with_changes(value=cst.Name("False"))
                        self.done.append(edit)
                        return updated.with_changes(args=args)
            return updated

    return Transformer()


def _code(node: Any, cst: Any) -> str:
    return str(cst.Module(body=[]).code_for_node(node)).strip()


def _same(a: str, b: str) -> bool:
    return " ".join(a.split()) == " ".join(b.split())


def _is_true(value: Any, cst: Any) -> bool:
    return isinstance(value, cst.Name) and value.value == "True"
