"""Phrases shared by rule messages: how a site, a tensor and a fix read."""

from __future__ import annotations

import re
from typing import Protocol

from ..sites import Site, describe_site, module_ref


class Context(Protocol):
    root_label: str


def short_op(op: str) -> str:
    """`aten.relu_` -> `relu_`, `c10d.broadcast_` stays qualified."""
    return op.removeprefix("aten.")


def where(site: Site, root_label: str) -> str:
    """`relu_` in model.features.3 (ReLU, call 2) at model.py:42."""
    return describe_site(site, root_label)


def tensor_desc(shape: tuple[int, ...], dtype: str) -> str:
    return f"a [{', '.join(map(str, shape))}] {dtype} tensor"


_AUGMENTED = re.compile(r"^(?P<lhs>[\w.\[\]:, ]+?)\s*(?P<op>\+|-|\*|/|//|@|%|\*\*|&|\||\^)=\s*(?P<rhs>.+)$")
_INPLACE_CALL = re.compile(r"\.(?P<name>[a-z][a-z0-9_]*?)_\(")


_INDEXED_TARGET = re.compile(r"^(?P<base>[A-Za-z_][\w.]*)\s*\[.*\]\s*=[^=]")


def without_comment(code: str) -> str:
    """`x[m] = 0  # pad` -> `x[m] = 0` (a `#` inside a string is kept)."""
    import io
    import tokenize

    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.COMMENT:
                return code[: tok.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass
    return code


def fix_for_write(site: Site, root_label: str) -> str:
    """The exact change that makes this write out of place."""
    code = without_comment(site.code or "")
    ref = module_ref(site, root_label)
    if site.module_inplace and ref is not None:
        return f"set `{ref}.inplace = False` (or construct it with inplace=False)"
    if site.api and site.api.endswith(".step"):
        return (
            f"call `{site.api}` only after every backward() that uses these parameters has run, "
            f"or recompute the forward after the step ({site.location})"
        )
    match = _AUGMENTED.match(code)
    if match:
        lhs, op, rhs = match["lhs"].strip(), match["op"], match["rhs"].strip()
        return f"replace `{code}` with `{lhs} = {lhs} {op} {rhs}` at {site.location}"
    call = _INPLACE_CALL.search(code)
    if call:
        name = call["name"]
        fixed = code.replace(f".{name}_(", f".{name}(", 1)
        return f"use the out-of-place `{name}`: replace `{code}` with `{fixed}` at {site.location}"
    if "inplace=True" in code:
        return f"pass inplace=False: replace `{code}` with `{code.replace('inplace=True', 'inplace=False')}` at {site.location}"
    if re.search(r"\]\s*=[^=]", code):
        target = _INDEXED_TARGET.match(code)
        name = target["base"] if target else "x"
        return (
            f"write into a copy (`{name} = {name}.clone()` before `{code}`) or build the result out of place "
            f"(torch.where) at {site.location}"
        )
    op = short_op(site.op)
    if op.endswith("_"):
        return f"use the out-of-place form of `{op}` (`{op[:-1]}`) at {site.location}, or modify a `.clone()`"
    return f"modify a `.clone()` of the tensor instead at {site.location}"
