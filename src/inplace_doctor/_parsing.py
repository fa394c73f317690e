"""`ast.parse` behind one lock.

CPython 3.11 keeps the AST conversion's recursion depth in interpreter-wide state: two threads
parsing at once (watch sessions of several threads, each saying a finding's fix) can raise
"SystemError: AST constructor recursion depth mismatch" (gh-106905). Every parse of the tool's
goes through here.
"""

from __future__ import annotations

import ast
import os
import threading

_LOCK = threading.RLock()
os.register_at_fork(after_in_child=_LOCK._at_fork_reinit)  # type: ignore[attr-defined]


def parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse(source)`, one thread at a time."""
    with _LOCK:
        return ast.parse(source, filename=filename)


def parse_expression(source: str) -> ast.expr:
    """The expression `source` is (`ast.parse(..., mode="eval").body`), one thread at a time."""
    with _LOCK:
        return ast.parse(source, mode="eval").body
