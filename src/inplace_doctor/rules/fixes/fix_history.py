"""The fix for a write autograd did not record into a tensor of the graph (IPD110), as edits.

Through an alias (`h.detach()[m] = 0`, `h.detach().mul_(2)`, `h.data...`), the
change is made on the tensor itself, out of place, so autograd records it:
`h = h.masked_fill(m, 0)` for a boolean mask, else a copy written by index,
`h = h.mul(2)` for a method. A write under `torch.no_grad()` also leaves the block:
the block is replaced by the write out of place when the write is all it holds.
"""

from __future__ import annotations

import ast

from ...findings import Fix, FixKind
from ...sites import Site
from .fix_builders import made, out_of_place, rebound, silent_write_fixes
from .source import Source, read, statement_at, tensor_method_exists


def history_fixes(site: Site, how: str, boolean_mask: bool) -> tuple[Fix, ...]:
    """The write at `site` made on the tensor itself (`how`: "detach", "data", "no_grad", ...)."""
    if how in ("no_grad", "inference_mode"):
        return _out_of_the_block(site, how)
    if how not in ("detach", "data"):
        return ()
    source = read(site.file)
    located = statement_at(source, site.line) if source is not None else None
    if source is None or located is None:
        return ()
    stmt = located.node
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        if isinstance(func, ast.Attribute) and _alias_of(func.value) is not None and tensor_method_exists(func.attr[:-1]):
            name = _alias_of(func.value)
            rest = source.segment(stmt.value)[len(source.segment(func)) :]
            return (made(FixKind.REBIND, source.replace(stmt, f"{name} = {name}.{func.attr.removesuffix('_')}{rest}")),)
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Subscript):
        target = stmt.targets[0]
        name = _alias_of(target.value)
        if name is not None:
            return (_indexed(source, stmt, target, name, boolean_mask),)
    return silent_write_fixes(site) if how == "data" else ()


def _alias_of(node: ast.expr) -> str | None:
    """`h` of `h.detach()` or `h.data` (a plain name)."""
    if isinstance(node, ast.Attribute) and node.attr == "data" and isinstance(node.value, ast.Name):
        return node.value.id
    if (
        isinstance(node, ast.Call) and not node.args and not node.keywords and isinstance(node.func, ast.Attribute)
        and node.func.attr == "detach" and isinstance(node.func.value, ast.Name)
    ):
        return node.func.value.id
    return None


def _indexed(source: Source, stmt: ast.Assign, target: ast.Subscript, name: str, boolean_mask: bool) -> Fix:
    index, value = source.segment(target.slice), source.segment(stmt.value)
    if boolean_mask and not isinstance(target.slice, ast.Tuple):
        return made(FixKind.OUT_OF_PLACE, source.replace(stmt, f"{name} = {name}.masked_fill({index}, {value})"))
    indent = source.indent_of(stmt)
    if indent is None:
        return Fix(FixKind.OUT_OF_PLACE)
    return made(FixKind.OUT_OF_PLACE, source.replace(stmt, f"{name} = {name}.clone()\n{indent}{name}[{index}] = {value}"))



def _out_of_the_block(site: Site, block: str) -> tuple[Fix, ...]:
    """A write alone in its `with torch.no_grad():` block (or `inference_mode()`): the block replaced by
    the write made out of place (`with torch.no_grad():\n    h.mul_(2)` -> `h = h.mul(2)`), so autograd
    records it; no edit when the block holds more, or the write has no out-of-place form here."""
    source = read(site.file)
    located = statement_at(source, site.line) if source is not None else None
    if source is None or located is None:
        return ()
    stmt, owner = located.node, located.owner
    if not (isinstance(owner, ast.With) and len(owner.items) == 1 and owner.body == [stmt]):
        return ()
    manager = owner.items[0].context_expr
    func = manager.func if isinstance(manager, ast.Call) else None
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name != block or owner.items[0].optional_vars is not None:
        return ()
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, (ast.Name, ast.Attribute)):
        new: str | None = out_of_place(source, stmt)
    else:
        new = rebound(source, stmt)
    return (made(FixKind.OUT_OF_PLACE, source.replace(owner, new)),) if new is not None else ()
