"""The fix for an update of parameters (an optimizer step, a `no_grad` write to a weight) that ran
between a forward and the backward needing that forward's values.

Two fixes, both the program's to choose: run the forward again after the update
(manual: which forward, and where, is a design decision), or move the update
after that backward (edits: delete the statement, insert it after the
backward's, at its indentation). The move is `unsafe` until `fix` proves it:
code between the two that reads the parameters (a Polyak target update) reads
them before the update once it is moved, and the later backward's gradient
accumulates into the stepped parameters' `.grad`.

Moving cannot help when the backward is a later run of a line above the update
in the same function (a loop): if the forward that saved ran before the loop,
it must run again inside it (recompute); if it ran inside, the backward reaches
an earlier iteration's graph through a tensor the loop carries across its
steps, and the fix is to detach that tensor (manual). A move is not offered for a statement that binds a name read
before the backward (`b = embedding(idx) @ W.t()`: the forward would lose `b`),
and is manual (no edits) across functions: there `self` and the locals are others.

Moving the step after the backward makes it apply that backward's gradient too (the critic of an
actor-critic step then trains on the actor's loss). The reorder such projects adopt is the other
way round (`update_first`): the later update (its `zero_grad`, its backward, its step) moved before
the update that overwrote, so it runs from the same forward first, and the earlier update's own
`zero_grad` then clears what the moved backward left in its parameters' `.grad`.
"""

from __future__ import annotations

import ast
import textwrap

from ...findings import Applicability, Fix, FixKind, Position
from ...sites import Site
from .source import COMPOUND, Located, Source, enclosing, function_at, read, statement_at


def step_fixes(site: Site, backward: Site | None, saved: Site | None = None) -> tuple[Fix, ...]:
    """An update of parameters between a forward and the backward that needs that forward's values:
    recompute the forward after the update (manual: which forward is the program's), or move the
    update after that backward (edits: delete the update, insert it after the backward). When that
    backward is a later run of a line above the update (a loop): recompute, if the forward that saved
    ran before the loop; detach what the loop carries, if it ran inside (`saved`: where it saved)."""
    loop = _loop_around(site, backward)
    if loop is not None:
        inside = saved is not None and any(
            f.file == site.file and loop.lineno <= f.line <= (loop.end_lineno or loop.lineno) for f in saved.stack
        )
        return (Fix(FixKind.DETACH_CARRIED),) if inside else (Fix(FixKind.RECOMPUTE),)
    first = update_first(site, backward)
    move = move_after(site, backward)
    return (Fix(FixKind.RECOMPUTE), *(f for f in (first, move) if f is not None))


def _loop_around(site: Site, backward: Site | None) -> ast.For | ast.While | None:
    """The innermost loop holding both the update and the backward when the backward's statement ends
    above the update's, in the same function of the same file: the backward that reached the old
    graph ran that line again, in a later iteration. None otherwise."""
    if backward is None or backward.file != site.file or backward.line is None or site.line is None:
        return None
    source = read(site.file)
    if source is None:
        return None
    update, after = statement_at(source, site.line), statement_at(source, backward.line)
    if update is None or after is None or _function(source, update) is not _function(source, after):
        return None
    if (after.node.end_lineno or after.node.lineno) >= update.node.lineno:
        return None
    last = update.node.end_lineno or update.node.lineno
    loops = [
        n for n in ast.walk(source.tree)
        if isinstance(n, (ast.For, ast.While)) and n.lineno <= after.node.lineno and last <= (n.end_lineno or n.lineno)
    ]
    return max(loops, key=lambda n: n.lineno) if loops else None


def _function(source: Source, located: Located) -> ast.AST | None:
    return function_at(source, located.node.lineno)


def _binds_a_name_read_before(source: Source, moved: ast.stmt, anchor: ast.stmt) -> bool:
    """Whether `moved` binds a name that its function reads between it and the end of `anchor`."""
    stored = {n.id for n in ast.walk(moved) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    if not stored:
        return False
    scope = function_at(source, moved.lineno) or source.tree
    first, last = (moved.end_lineno or moved.lineno) + 1, anchor.end_lineno or anchor.lineno
    return any(
        isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in stored and first <= n.lineno <= last
        for n in ast.walk(scope)
    )


def move_after(site: Site, backward: Site | None) -> Fix | None:
    """The statement that updated (`opt.step()`; a `with torch.no_grad():` holding only the update
    moves whole) deleted, and inserted after the backward's statement at its indentation; None when
    the statement binds a name read before the backward (moved, the program would not run)."""
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
    if site.file == backward.file and _binds_a_name_read_before(source, moved, anchor):
        return None
    if site.file != backward.file or function_at(source, moved.lineno) is not function_at(target_source, anchor.lineno):
        return manual  # another function: its `self` and locals are other objects
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
    delete = source.edit(Position(first, 0), Position(last + 1, 0), text, "")
    insert = target_source.edit(end, end, "", f"\n{block}")
    return Fix(FixKind.MOVE_STATEMENT, (delete, insert), Applicability.UNSAFE)  # proven only by `fix`


def _shares_its_last_line(source: Source, node: ast.stmt) -> bool:
    """Whether other code follows `node` on its last line (`opt.step(); x = 1`): a whole-line move would carry it."""
    end = source.end(node)
    tail = source.line_text(end.line)[end.column :].strip()
    return bool(tail) and not tail.startswith("#")


def update_first(site: Site, backward: Site | None) -> Fix | None:
    """The later update moved before the one that overwrote (module docstring): in one block of one
    function, the statements after the update through the backward (and a step that follows it) are
    inserted before the update's own group (its backward, and the `zero_grad` calls right above it).
    None when there is no such group, the two groups share a name one binds, or a line holds two."""
    if backward is None or backward.file != site.file:
        return None
    source = read(site.file)
    if source is None:
        return None
    update, later = _calling(source, site.line, "step"), _calling(source, backward.line, "backward")
    if update is None or later is None or update.block != later.block:
        return None
    block = list(update.block)
    i, j = block.index(update.node), block.index(later.node)
    if update.owner is not later.owner or j <= i:
        return None
    start = next((k for k in range(i - 1, -1, -1) if _calls(block[k], "backward")), None)
    if start is None:
        return None
    while start > 0 and _calls(block[start - 1], "zero_grad") and not isinstance(block[start - 1], COMPOUND):
        start -= 1
    end = j
    for m in range(j + 1, len(block)):
        if isinstance(block[m], COMPOUND) or _calls(block[m], "backward"):
            break
        if _calls(block[m], "step"):
            end = m
            break
    group, moved = block[start : i + 1], block[i + 1 : end + 1]
    if _shared_names(group, moved) or not (_own_lines(source, block, start, i + 1) and _own_lines(source, block, i + 1, end + 1)):
        return None
    first = _attached_comments(source, moved[0].lineno)
    last = moved[-1].end_lineno or moved[-1].lineno
    text = "".join(source.lines[first - 1 : last])
    if not text.endswith("\n"):
        return None
    gap = first - 1 > (block[i].end_lineno or block[i].lineno) and not source.lines[first - 2].strip()
    delete = source.edit(Position(first - 1 if gap else first, 0), Position(last + 1, 0),
                         "".join(source.lines[(first - 2 if gap else first - 1) : last]), "")
    at = Position(_attached_comments(source, group[0].lineno), 0)
    insert = source.edit(at, at, "", text + ("\n" if gap else ""))
    return Fix(FixKind.UPDATE_FIRST, (insert, delete), Applicability.UNSAFE)  # proven only by `fix`


def _calling(source: Source, line: int | None, method: str) -> Located | None:
    """The statement at `line`; of several on it (`opt.zero_grad(); loss.backward(); opt.step()`), the one
    that calls `method`."""
    located = statement_at(source, line)
    if located is None:
        return None
    on_line = [s for s in located.block if s.lineno <= (line or 0) <= (s.end_lineno or s.lineno)]
    calling = [s for s in on_line if _calls(s, method)]
    return Located(calling[-1], located.block, located.owner) if calling else located


def _calls(stmt: ast.stmt, method: str) -> bool:
    """Whether `stmt` calls `<something>.method(...)` (`loss.backward()`, `opt.zero_grad()`)."""
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == method for n in ast.walk(stmt)
    )


def _shared_names(one: list[ast.stmt], other: list[ast.stmt]) -> bool:
    """Whether a name one list of statements binds is read or bound by the other: reordered, it would change."""
    def names(stmts: list[ast.stmt], ctx: type) -> set[str]:
        return {n.id for s in stmts for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}

    a_bound, b_bound = names(one, ast.Store) | names(one, ast.Del), names(other, ast.Store) | names(other, ast.Del)
    return bool(a_bound & (names(other, ast.Load) | b_bound) or b_bound & names(one, ast.Load))


def _own_lines(source: Source, block: list[ast.stmt], start: int, stop: int) -> bool:
    """Whether block[start:stop] begins and ends on lines no neighbouring statement shares."""
    if source.indent_of(block[start]) is None:
        return False
    before = block[start - 1] if start > 0 else None
    if before is not None and (before.end_lineno or before.lineno) >= block[start].lineno:
        return False
    last = block[stop - 1]
    return not _shares_its_last_line(source, last) and (
        stop >= len(block) or block[stop].lineno > (last.end_lineno or last.lineno)
    )


def _attached_comments(source: Source, line: int) -> int:
    """The first line of the comment lines right above `line` (no blank line between), else `line`."""
    while line > 1 and source.lines[line - 2].strip().startswith("#"):
        line -= 1
    return line
