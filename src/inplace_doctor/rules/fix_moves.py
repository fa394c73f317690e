"""The fix for an update of parameters (an optimizer step, a `no_grad` write to a weight) that ran
between a forward and the backward needing that forward's values.

Two fixes, both the program's to choose: run the forward again after the update
(manual: which forward, and where, is a design decision), or move the update
after that backward (edits: delete the statement, insert it after the
backward's, at its indentation). The move is `unsafe` until `fix` proves it:
code between the two that reads the parameters (a Polyak target update) reads
them before the update once it is moved, and the later backward's gradient
accumulates into the stepped parameters' `.grad`.
"""

from __future__ import annotations

import ast
import textwrap

from ..findings import Applicability, Edit, Fix, FixKind, Position
from ..sites import Site
from .source import Source, enclosing, read, statement_at


def step_fixes(site: Site, backward: Site | None) -> tuple[Fix, ...]:
    """An update of parameters between a forward and the backward that needs that forward's values:
    recompute the forward after the update (manual: which forward is the program's), or move the
    update after that backward (edits: delete the update, insert it after the backward)."""
    return (Fix(FixKind.RECOMPUTE), move_after(site, backward))


def move_after(site: Site, backward: Site | None) -> Fix:
    """The statement that updated (`opt.step()`; a `with torch.no_grad():` holding only the update
    moves whole) deleted, and inserted after the backward's statement at its indentation."""
    manual = Fix(FixKind.MOVE_STATEMENT)
    if backward is None:
        return manual
    source, target_source = read(site.file), read(backward.file)
    if source is None or target_source is None:
        return manual
    located, after = statement_at(source, site.line), statement_at(target_source, backward.line)
    if located is None or after is None:
        return manual
    if len(located.block) == 1:  # the update alone in its block: the block moves (`with no_grad():`)
        outer = enclosing(source, located.node)
        if outer is None or not isinstance(outer.node, ast.With):
            return manual
        located = outer
    moved, anchor = located.node, after.node
    if len(located.block) == 1 or source.indent_of(moved) is None or target_source.indent_of(anchor) is None:
        return manual  # deleting it would leave an empty block, or it shares its line
    first, last = moved.lineno, moved.end_lineno or moved.lineno
    if site.file == backward.file and first <= (anchor.end_lineno or anchor.lineno) and anchor.lineno <= last:
        return manual
    if _shares_its_last_line(source, moved) or not source.lines[last - 1].endswith("\n"):
        return manual
    text = "".join(source.lines[first - 1 : last])
    indent = target_source.indent_of(anchor) or ""
    block = textwrap.indent(textwrap.dedent(text), indent).rstrip("\n")
    end_line = anchor.end_lineno or anchor.lineno
    end = Position(end_line, len(target_source.line_text(end_line)))
    delete = Edit(source.path, Position(first, 0), Position(last + 1, 0), text, "")
    insert = Edit(target_source.path, end, end, "", f"\n{block}")
    return Fix(FixKind.MOVE_STATEMENT, (delete, insert), Applicability.UNSAFE)  # proven only by `fix`


def _shares_its_last_line(source: Source, node: ast.stmt) -> bool:
    """Whether other code follows `node` on its last line (`opt.step(); x = 1`): a whole-line move would carry it."""
    end = source.end(node)
    tail = source.line_text(end.line)[end.column :].strip()
    return bool(tail) and not tail.startswith("#")
