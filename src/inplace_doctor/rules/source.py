"""The user's source at a site, read with the standard library's `ast`: what the fix builders edit.

`ast` rather than libcst: libcst is an optional extra, and a fix builder runs
in every audit and watch, so it must work without it. `ast` gives each
statement's exact extent (`lineno`/`col_offset`/`end_lineno`/`end_col_offset`,
columns in UTF-8 bytes, turned into characters here) and its text
(`ast.get_source_segment`), which is all an `Edit` needs: the edit replaces a
range by new text, and every other byte of the file stays as it was.

The file is read through `linecache` (decoded with its BOM or PEP 263
encoding, line endings read as "\\n"), as the tracer read the site's line.
"""

from __future__ import annotations

import ast
import functools
import linecache
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from ..findings import Edit, Position

_COMPOUND = (
    ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.FunctionDef,
    ast.AsyncFunctionDef, ast.ClassDef, ast.Match, ast.TryStar,
)

Node = ast.expr | ast.stmt  # what has a position


@dataclass(frozen=True, eq=False)
class Source:
    """One file's text, its lines and its syntax tree (one object per content: `read` caches it,
    so what is looked up in it is cached by identity)."""

    path: str
    text: str
    lines: tuple[str, ...]
    tree: ast.Module

    def segment(self, node: Node) -> str:
        return ast.get_source_segment(self.text, node) or ""

    def start(self, node: Node) -> Position:
        return Position(node.lineno, _chars(self.lines[node.lineno - 1], node.col_offset))

    def end(self, node: Node) -> Position:
        line = node.end_lineno or node.lineno
        return Position(line, _chars(self.lines[line - 1], node.end_col_offset or node.col_offset))

    def line_text(self, line: int) -> str:
        """The line without its line ending."""
        return self.lines[line - 1].rstrip("\r\n")

    def indent_of(self, node: ast.stmt) -> str | None:
        """The indentation before `node` when it is the first statement on its line, else None."""
        start = self.start(node)
        before = self.line_text(start.line)[: start.column]
        return before if not before.strip() else None

    def replace(self, node: Node, new: str) -> Edit:
        """An edit replacing `node`'s text by `new`."""
        return Edit(self.path, self.start(node), self.end(node), self.segment(node), new)

    def insert_before(self, node: ast.stmt, statement: str) -> Edit | None:
        """An edit inserting `statement` on its own line before `node`, at its indentation (None
        when `node` does not start its line: `if c: h[0] = 1`)."""
        indent = self.indent_of(node)
        if indent is None:
            return None
        at = self.start(node)
        return Edit(self.path, at, at, "", f"{statement}\n{indent}")

    def names(self) -> frozenset[str]:
        """Every name the file binds or reads (for a fresh name that shadows nothing)."""
        out = {n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name)}
        out |= {n.arg for n in ast.walk(self.tree) if isinstance(n, ast.arg)}
        return frozenset(out)


def _chars(line: str, byte_column: int) -> int:
    """`ast`'s UTF-8 byte column as a column in characters."""
    return len(line.encode("utf-8")[:byte_column].decode("utf-8", errors="ignore"))


_INSTALLED = tuple(f"{os.sep}{d}{os.sep}" for d in ("site-packages", "dist-packages"))


def read(path: str | None) -> Source | None:
    """The file at `path`, parsed; None when it cannot be read or does not parse, and for an installed
    package's file (torchvision's `out += identity`): a fix never edits a library in place."""
    if not path or any(marker in path for marker in _INSTALLED):
        return None
    lines = tuple(linecache.getlines(path))
    return _parse(path, lines) if lines else None


@functools.lru_cache(maxsize=64)
def _parse(path: str, lines: tuple[str, ...]) -> Source | None:
    text = "".join(lines)
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    return Source(path, text, lines, tree)


@dataclass(frozen=True)
class Located:
    """A simple statement, the block (list of statements) that holds it, and the node that owns the block."""

    node: ast.stmt
    block: tuple[ast.stmt, ...]
    owner: ast.AST


@functools.lru_cache(maxsize=1024)
def statement_at(source: Source, line: int | None) -> Located | None:
    """The innermost simple (not compound) statement whose lines include `line`."""
    if line is None:
        return None
    best: Located | None = None
    for owner, block in _blocks(source.tree):
        for stmt in block:
            if isinstance(stmt, _COMPOUND) or not (stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno)):
                continue
            span = (stmt.end_lineno or stmt.lineno) - stmt.lineno
            if best is None or span < (best.node.end_lineno or 0) - best.node.lineno:
                best = Located(stmt, tuple(block), owner)
    return best


def written_statement(source: Source, line: int | None, op: str, augmented: bool) -> Located | None:
    """The statement at `line` that made the write `op` (`aten.mul_`): of several simple statements
    on the line (`h.mul_(2); g.mul_(3)`), the one calling that method (an augmented assignment for
    `x += y`), or the indexed assignments to one tensor (`h[0] = 0; h[1] = 0`: a copy before the
    first serves both); None when the line leaves it open which statement wrote."""
    located = statement_at(source, line)
    if located is None or line is None:
        return located
    sharing = [s for s in located.block if s.lineno <= line <= (s.end_lineno or s.lineno)]
    if len(sharing) < 2:
        return located
    name = op.rsplit(".", 1)[-1]
    writing = [
        s for s in sharing
        if (isinstance(s, ast.AugAssign) if augmented else any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == name for n in ast.walk(s)))
    ] or [s for s in sharing if _indexed(s) is not None]
    if not writing:
        return located
    bases = {_indexed(s) for s in writing}
    if len(writing) > 1 and (len(bases) > 1 or None in bases):
        return None
    return Located(writing[0], located.block, located.owner)


def _indexed(stmt: ast.stmt) -> str | None:
    """`h` of `h[m] = v` (the name an indexed assignment writes into)."""
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
    if len(targets) == 1 and isinstance(targets[0], ast.Subscript) and isinstance(targets[0].value, ast.Name):
        return targets[0].value.id
    return None


def out_of_place_function(source: Source, call: ast.Call) -> str | None:
    """`F.relu` for `F.relu_(h)`: the out-of-place twin of an in-place function of a module the file
    imports, when that module, as the program imported it, has one; None else (`init.zeros_` has none,
    and `init.normal` is not one: torch.nn.init's names without `_` are deprecated in-place aliases)."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr.endswith("_") and not func.attr.startswith("_")):
        return None
    path: list[str] = []
    node = func.value
    while isinstance(node, ast.Attribute):
        path.insert(0, node.attr)
        node = node.value
    dotted = _modules_bound(source).get(node.id) if isinstance(node, ast.Name) else None
    owner: object = sys.modules.get(dotted) if dotted else None  # never imported here: what the program ran
    for attr in path:
        owner = getattr(owner, attr, None)
    if getattr(owner, "__name__", None) == "torch.nn.init":
        return None  # its `normal`, `uniform`, ... are deprecated aliases that write in place too
    twin = getattr(owner, func.attr[:-1], None) if owner is not None else None
    return f"{source.segment(func.value)}.{func.attr[:-1]}" if callable(twin) else None


def _modules_bound(source: Source) -> dict[str, str]:
    """Name -> the module an import binds to it (`import torch.nn.functional as F`: F; `from torch.nn
    import init`: init; `import torch.nn`: torch)."""
    out: dict[str, str] = {}
    for n in ast.walk(source.tree):
        if isinstance(n, ast.Import):
            out.update({a.asname or a.name.split(".")[0]: a.name if a.asname else a.name.split(".")[0] for a in n.names})
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            out.update({a.asname or a.name: f"{n.module}.{a.name}" for a in n.names})
    return out


def enclosing(source: Source, node: ast.stmt) -> Located | None:
    """The compound statement directly holding `node` in one of its blocks, located in its own block."""
    for owner, block in _blocks(source.tree):
        for stmt in block:
            if any(node in inner for _, inner in _own_blocks(stmt)):
                return Located(stmt, tuple(block), owner)
    return None


def function_at(source: Source, line: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The innermost function whose lines include `line`."""
    inside = [
        n for n in ast.walk(source.tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.lineno <= line <= (n.end_lineno or n.lineno)
    ]
    return min(inside, key=lambda n: (n.end_lineno or n.lineno) - n.lineno) if inside else None


def _own_blocks(node: ast.AST) -> list[tuple[ast.AST, list[ast.stmt]]]:
    out: list[tuple[ast.AST, list[ast.stmt]]] = []
    for name in ("body", "orelse", "finalbody"):
        block = getattr(node, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            out.append((node, block))
    for handler in getattr(node, "handlers", None) or ():
        out.append((handler, handler.body))
    for case in getattr(node, "cases", None) or ():
        out.append((case, case.body))
    return out


@functools.lru_cache(maxsize=64)
def _blocks(tree: ast.AST) -> tuple[tuple[ast.AST, list[ast.stmt]], ...]:
    """Every block of statements in the tree, with the node that owns it."""
    out: list[tuple[ast.AST, list[ast.stmt]]] = []
    for node in ast.walk(tree):
        out.extend(_own_blocks(node))
    return tuple(out)


def passed_argument(tree: ast.AST, function: str, params: Sequence[str], name: str) -> ast.expr | None:
    """The expression a call of `function` in `tree` passes for its parameter `name` (`params`: the
    function's parameter names; `self`/`cls` dropped for a method call), by keyword or by position
    (not past a `*args`); None when no call passes it."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if called != function:
            continue
        for kw in node.keywords:
            if kw.arg == name:
                return kw.value
        positional = list(params)
        if isinstance(func, ast.Attribute) and positional[:1] in (["self"], ["cls"]):
            positional = positional[1:]
        index = positional.index(name) if name in positional else -1
        if 0 <= index < len(node.args) and not any(isinstance(a, ast.Starred) for a in node.args[: index + 1]):
            return node.args[index]
    return None
