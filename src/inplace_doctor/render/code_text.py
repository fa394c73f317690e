"""The user's code as a sentence quotes it: a source line without its comment, statements on one
line (`one_line`), moved statements (`moved_code`)."""

from __future__ import annotations

import io
import textwrap
import tokenize

from .._parsing import parse
from ..rules.fixes.source import COMPOUND


def without_comment(code: str) -> str:
    """`x[m] = 0  # pad` -> `x[m] = 0` (a `#` inside a string is kept)."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.COMMENT:
                return code[: tok.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass
    return code


def one_line(code: str) -> str:
    """Statements on several lines shown on one, as Python would accept them: `a = f(b); b = a`;
    one statement over several lines (in brackets, after a backslash) joined into one:
    `h.mul_(\\n    2,\\n)` is `h.mul_(2,)`. A fragment that is no statement keeps a `; ` per line."""
    statements: list[str] = []
    pending: list[str] = []
    comment = ""  # the last statement's own comment: any other would swallow what follows it
    for raw in code.splitlines():
        line = without_comment(raw).strip()
        if not line:
            continue
        continued = line.endswith("\\")
        pending.append(line[:-1].rstrip() if continued else line)
        if not continued and _parses(joined := _joined(pending)):
            statements.append(joined)
            comment, pending = raw.strip()[len(line):], []
    if pending:
        return "; ".join([*statements, *pending])
    return "; ".join(statements) + comment


def _joined(lines: list[str]) -> str:
    """Physical lines of one statement, with a space between them except inside brackets' edges and
    before an attribute (`h` and `.mul_(2)`)."""
    out = lines[0]
    for line in lines[1:]:
        tight = out.endswith(("(", "[", "{")) or line.startswith((")", "]", "}", "."))
        out += line if tight or not out else f" {line}"
    return out


def _parses(text: str) -> bool:
    try:
        parse(text)
    except SyntaxError:
        return False
    return True


def moved_code(text: str) -> str:
    """Moved statements as a quote: on one line when they are simple (`a_opt.zero_grad(); loss.backward()`),
    else the first line and how many follow (a `with` block does not read on one line)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # an edit's text ends its lines as its file does
    lines = [line for line in text.splitlines() if without_comment(line).strip()]
    try:
        simple = not any(isinstance(n, COMPOUND) for n in parse(textwrap.dedent(text)).body)
    except (SyntaxError, ValueError):
        simple = False
    if simple or len(lines) <= 1:
        return f"`{one_line(text)}`"
    return f"`{without_comment(lines[0]).strip()}` and the {len(lines) - 1} line(s) after it"
