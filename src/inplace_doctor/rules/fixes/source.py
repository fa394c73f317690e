"""The user's source at a site, read with the standard library's `ast`: what the fix builders edit.

`ast` rather than libcst: libcst is an optional extra, and a fix builder runs
in every audit and watch, so it must work without it. `ast` gives each
statement's exact extent (`lineno`/`col_offset`/`end_lineno`/`end_col_offset`,
columns in UTF-8 bytes, turned into characters here) and its text
(`ast.get_source_segment`), which is all an `Edit` needs: the edit replaces a
range by new text, and every other byte of the file stays as it was.

The file is read through `linecache` (decoded with its BOM or PEP 263
encoding, line endings read as "\\n"), as the tracer read the site's line. An
`Edit`'s texts end their lines as the file's bytes do (`Source.edit`): a CRLF
file's edit reads and writes "\\r\\n", so splicing it into the decoded file gives
the bytes `fix` writes.
"""

from __future__ import annotations

import ast
import functools
import linecache
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from ..._parsing import parse
from ...findings import Edit, Position
from .line_endings import file_endings, in_file_endings

COMPOUND = (  # statements that hold blocks
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
        return self.edit(self.start(node), self.end(node), self.segment(node), new)

    def insert_before(self, node: ast.stmt, statement: str) -> Edit | None:
        """An edit inserting `statement` on its own line before `node`, at its indentation (None
        when `node` does not start its line: `if c: h[0] = 1`)."""
        indent = self.indent_of(node)
        if indent is None:
            return None
        at = self.start(node)
        return self.edit(at, at, "", f"{statement}\n{indent}")

    def edit(self, start: Position, end: Position, old: str, new: str) -> Edit:
        """An edit of this file from texts whose lines end in "\\n" (as `lines`), ending them as the
        file's bytes do (`line_endings.py`): the bytes `fix` writes."""
        old, new = in_file_endings(file_endings(self.path, self.lines), start.line, old, new)
        return Edit(self.path, start, end, old, new, self.lines)

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
        tree = parse(text)
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
            if isinstance(stmt, COMPOUND) or not (stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno)):
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


def written_receiver(stmt: ast.stmt) -> str | None:
    """`h` of `h.copy_(v)`, `h[0].zero_()` or `h.detach().mul_(2)` alone, when no rebinding fixes it (no
    out-of-place method, or a part or alias of `h` written): the name whose tensor a copy before the write
    protects."""
    call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
    func = call.func if call is not None else None
    if not (isinstance(func, ast.Attribute) and func.attr.endswith("_") and not func.attr.startswith("_")):
        return None
    receiver = func.value
    while True:
        if isinstance(receiver, ast.Subscript):
            receiver = receiver.value
        elif isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Attribute) and not receiver.args and (
            receiver.func.attr == "detach"  # an alias sharing the memory and the version counter
        ):
            receiver = receiver.func.value
        else:
            return receiver.id if isinstance(receiver, ast.Name) else None


def names_a_module(path: str | None, name: str) -> bool:
    """Whether the file at `path` binds `name` by an import (`F`, `init`, `torch`): a call on it is
    a function of that module, not a method of a tensor."""
    source = read(path)
    return source is not None and name in _modules_bound(source)


def tensor_method_exists(name: str) -> bool:
    """Whether tensors have a method `name`: the out-of-place twin of `relu_` exists, those of
    `copy_`, `zero_`, `fill_`, `normal_` do not (a fix must never name a method that is not there)."""
    import torch  # the package's own import of torch; here only when a fix is built

    return callable(getattr(torch.Tensor, name, None))


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


def grad_off_block(source: Source, node: ast.stmt) -> ast.With | None:
    """The outermost `with torch.no_grad():` (`inference_mode()`, `set_grad_enabled(False)`) around
    `node`: a result made out of place inside it carries no gradient, a copy made before it does."""
    found: ast.With | None = None
    located = enclosing(source, node)
    while located is not None:
        if isinstance(located.node, ast.With) and any(_turns_grad_off(i.context_expr) for i in located.node.items):
            found = located.node
        located = enclosing(source, located.node)
    return found


def _turns_grad_off(expr: ast.expr) -> bool:
    if not isinstance(expr, ast.Call):
        return False
    name = expr.func.attr if isinstance(expr.func, ast.Attribute) else getattr(expr.func, "id", "")
    first = expr.args[0] if expr.args else None
    false = isinstance(first, ast.Constant) and first.value is False
    return false if name == "set_grad_enabled" else name in ("no_grad", "inference_mode") and not false


def indexed_base(stmt: ast.stmt) -> str | None:
    """`h` of `h[m] = v` / `h[m] += v` (the name whose tensor an indexed write changes)."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target: ast.expr = stmt.targets[0]
    elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
        target = stmt.target
    else:
        return None
    if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
        return target.value.id
    return None


def written_name(stmt: ast.stmt) -> str | None:
    """The plain name a statement writes into: `x += y`, `x[m] = v`, `x.relu_()`."""
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
        return stmt.target.id
    indexed = indexed_base(stmt)
    if indexed is not None:
        return indexed
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        if isinstance(func, ast.Attribute) and func.attr.endswith("_") and not func.attr.startswith("_") and isinstance(func.value, ast.Name):
            return func.value.id
    return None


def grad_off_copy(source: Source, stmt: ast.stmt) -> tuple[str | None, ast.With] | None:
    """For a write inside a grad-off block (`grad_off_block`): the name a copy made before the block
    rebinds (None when the write has no plain name, or the block binds it) and the block."""
    block = grad_off_block(source, stmt)
    if block is None:
        return None
    name = written_name(stmt) or written_receiver(stmt)
    return (name if name is not None and name not in _bound_in(block, stmt) else None), block


def _bound_in(block: ast.stmt, besides: ast.stmt) -> set[str]:
    """Names a statement inside `block` other than `besides` binds (a copy before the block would miss them)."""
    inside = {id(n) for n in ast.walk(besides)}
    return {
        n.id for n in ast.walk(block) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and id(n) not in inside
    }


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
