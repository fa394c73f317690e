"""How a finding's line is followed through the edits `fix` makes: the name it keeps across runs.

A finding is named by its rule, its file, its written line's text and which line
that is (`prove.identity`). An edit that inserts a line moves every line below it,
and one that rewrites a line changes its text, so each run's lines are followed
back to the program's as fix started (`origins`), and a rewritten line's old text
to its new one (`rewritten`, `renamed`): two identical lines (`h.mul_(2)` in two
modules' forwards) stay two findings, and a finding on a line an edit moved or
rewrote stays the one it was.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from .source_edits import Source

if TYPE_CHECKING:
    from .prove import Identity


def rewritten(changes: dict[str, tuple[bytes, bytes]], root: str) -> dict[tuple[str, str], set[str]]:
    """(file relative to the project, a line's text) -> what that line reads after the edits, for
    each line an edit rewrote in place (not one it inserted or removed): how a finding's name moves."""
    out: dict[tuple[str, str], set[str]] = {}
    for path, (before, after) in changes.items():
        rel = os.path.relpath(path, root)
        old, new = (texts(Source.of(data, path)) for data in (before, after))
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
            if tag == "replace" and i2 - i1 == j2 - j1:
                for a, b in zip(old[i1:i2], new[j1:j2]):
                    out.setdefault((rel, a), set()).add(b)
    return out


def texts(source: Source) -> list[str]:
    """Each line's text as a finding's identity names it (whitespace runs as one space)."""
    starts = source.line_starts()
    ends = [*starts[1:], len(source.data)]
    return [" ".join(source.data[a:b].decode(source.encoding, "replace").split()) for a, b in zip(starts, ends)]


def renamed(ids: set[Identity], renames: dict[tuple[str, str], set[str]]) -> set[Identity]:
    """The names `ids` have when their lines read as the edits rewrote them (the line, followed, is the same)."""
    return {i._replace(text=text) for i in ids for text in renames.get((i.path, i.text), ())}


def origins(state: Mapping[str, bytes], original: Callable[[str], bytes | None], root: str) -> dict[str, tuple[int, ...]]:
    """For each file `state` changed (its path relative to the project): the line of the program as
    fix started that each of its lines is (0: a line the edits wrote). A line an edit rewrote in
    place is the line it was, and a line moved (deleted in one place, its text inserted once in
    another) too: what `prove.identity` names a finding by while edits move lines. `original`: a
    file's bytes as fix started (`Workspace.original`), by its absolute path under `root`."""
    out: dict[str, tuple[int, ...]] = {}
    for path, data in state.items():
        before = original(path)
        if before is not None:
            out[os.path.relpath(path, root)] = followed(texts(Source.of(before, path)), texts(Source.of(data, path)))
    return out


def followed(old: list[str], new: list[str]) -> tuple[int, ...]:
    """For each line of `new` (texts), the 1-based line of `old` it is, or 0 (`origins`)."""
    out = [0] * len(new)
    gone: dict[str, list[int]] = {}  # text -> the old lines with it that the edits deleted
    came: dict[str, list[int]] = {}  # text -> the new lines with it that the edits inserted
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            out[j1:j2] = range(i1 + 1, i2 + 1)
            continue
        for i in range(i1, i2):
            gone.setdefault(old[i], []).append(i + 1)
        for j in range(j1, j2):
            came.setdefault(new[j], []).append(j)
    for text, at in came.items():
        if text and len(at) == 1 and len(gone.get(text, ())) == 1:
            out[at[0]] = gone[text][0]
    return tuple(out)
