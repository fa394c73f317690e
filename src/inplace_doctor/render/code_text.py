"""The user's code as a sentence quotes it: a source line without its comment."""

from __future__ import annotations

import io
import tokenize


def without_comment(code: str) -> str:
    """`x[m] = 0  # pad` -> `x[m] = 0` (a `#` inside a string is kept)."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.COMMENT:
                return code[: tok.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass
    return code
