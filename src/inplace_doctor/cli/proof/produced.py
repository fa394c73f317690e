"""What a proof compares besides the recorded values, and when it proves nothing (issue 38, items 1-2).

A fix is proven only from runs that did the work, compared on everything the program produces:
- `unprovable`: why a trial proves nothing whatever its values: the intended program did not run
  to its end with exit 0, a run was refused a write outside its copy or a program it started
  (`confine.py`), the intended program never ran the finding's line or the edited one never ran
  its edited lines (`reach.py`);
- `produced_difference`: the first difference in what the program produced: its standard output,
  its standard error (the tool's own `inplace-doctor` lines left out), the files it wrote in its copy;
- `finding_sites`, `edited_groups`, `changed_lines`: the `--reach` groups (the findings' lines, the
  lines an edit wrote), and `did_the_work`, which marks a verdict with all of the above;
- `stamps` and `written`: the files a run wrote in its copy.
"""

from __future__ import annotations

import difflib
import hashlib
import os
from collections.abc import Callable
from typing import Any, Protocol

from ...findings import Finding
from .copy_room import files_under


class _Record(Protocol):  # `prove.Record`, as read here (prove.py imports this module)
    @property
    def refused(self) -> tuple[tuple[str, str], ...]: ...

    @property
    def unreached(self) -> tuple[str, ...]: ...

    @property
    def ran(self) -> bool: ...

    @property
    def ended(self) -> str: ...


class _Run(Protocol):  # `prove.Run`, as read here
    out: bytes
    err: bytes
    written: dict[str, str]

    @property
    def record(self) -> _Record | None: ...


def unprovable(trial: _Run, reference: _Run, site: str | None) -> str:
    """Why `trial` proves nothing against `reference` whatever its values ("" when it may prove);
    `site`: the finding's `FILE:LINE` label in the reference's `--reach` groups, if it has one."""
    ref = reference.record
    for run, who in ((reference, "the intended program"), (trial, "the edited program")):
        if run.record is not None and run.record.refused:
            what, path = run.record.refused[0]
            if what == "starts":
                return (f"not provable: {who} starts another program (`{path}`), whose writes a proof cannot keep "
                        "inside its copy of the project")
            return (f"not provable: {who} writes to {path}, outside the project: a proof run changes nothing outside "
                    "its copy (write under the working directory, or run fix from a folder that holds that path)")
    if ref is None or not ref.ran:
        ended = ref.ended if ref is not None else "did not start"
        return f"the intended program (every saved tensor copied at save) {ended}: nothing can be proven equal to it"
    if site is not None and site in ref.unreached:
        return (f"nothing was proven: the intended program, run in a copy of the project, never ran {site} (the "
                "finding's line), so the runs compared did not do the work (does the script skip its work when a file "
                "it wrote exists, or read its input from outside the project?)")
    if trial.record is not None and trial.record.unreached:
        return (f"nothing was proven: the edited program never ran {trial.record.unreached[0]} (the edited line), "
                "so the runs compared did not do the work")
    return ""


def produced_difference(got: _Run, want: _Run, who: str = "the intended program") -> str:
    """The first difference between what two runs produced besides recorded values, in words; ''."""
    for name, a, b in (("standard output", got.out, want.out), ("standard error", got.err, want.err)):
        if a != b:
            return f"its {name} differs: {_first_line_difference(a, b, who)}"
    if got.written != want.written:
        for rel in sorted(set(got.written) | set(want.written)):
            mine, theirs = got.written.get(rel), want.written.get(rel)
            if mine != theirs:
                if theirs is None:
                    return f"it wrote {rel}, which {who} did not"
                if mine is None:
                    return f"it did not write {rel}, which {who} wrote"
                return f"it wrote {rel} with other bytes than {who}" if mine != "deleted" else f"it deleted {rel}"
    return ""


def _first_line_difference(a: bytes, b: bytes, who: str) -> str:
    ours, theirs = a.splitlines(), b.splitlines()
    for n, (x, y) in enumerate(zip(ours, theirs), 1):
        if x != y:
            return f"line {n} reads `{_shown(x)}` where {who} printed `{_shown(y)}`"
    if len(ours) != len(theirs):
        n = min(len(ours), len(theirs)) + 1
        return (f"it printed {len(ours)} line(s), {who} {len(theirs)} (line {n}: "
                f"`{_shown((ours if len(ours) > len(theirs) else theirs)[n - 1])}`)")
    return "in its line endings"


def _shown(line: bytes) -> str:
    text = line.decode("utf-8", "replace").strip()
    return text if len(text) <= 100 else text[:97] + "..."


def changed_lines(before: bytes, after: bytes) -> frozenset[int]:
    """The lines (1-based) of `after` that an edit wrote: not in a block equal to `before`'s."""
    old, new = before.splitlines(), after.splitlines()
    out: set[int] = set()
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            out.update(range(j1 + 1, j2 + 1))
    return frozenset(out)


def stamps(tree: str) -> dict[str, tuple[int, int]]:
    """Each file under `tree` (relative path) -> (size, modification time in ns), links not followed."""
    return {rel: (st.st_size, st.st_mtime_ns) for rel, st in files_under(tree, lambda _, dirs: {"__pycache__"} & set(dirs))}


def written(tree: str, before: dict[str, tuple[int, int]], edited: set[str]) -> dict[str, str]:
    """The files a run wrote in its copy (relative path -> a digest of the bytes, or "deleted"),
    found by size and time against `before`; the edited files themselves are the edit's, not the run's."""
    after = stamps(tree)
    out: dict[str, str] = {}
    for rel, stamp in after.items():
        if rel in edited or before.get(rel) == stamp:
            continue
        try:
            with open(os.path.join(tree, rel), "rb") as f:
                out[rel] = hashlib.blake2b(f.read(), digest_size=8).hexdigest()
        except OSError:
            out[rel] = "unreadable"
    out.update((rel, "deleted") for rel in before if rel not in after and rel not in edited)
    return out


def finding_sites(findings: list[Finding], rebase: Callable[[str], str], root: str) -> dict[str, tuple[str, frozenset[int]]]:
    """The `--reach` groups of the findings' lines, each its own group (`rebase`: a path as the project names it)."""
    places = (place for f in findings if (place := _place(f, rebase)) is not None)
    return {label(path, root, line): (path, frozenset({line})) for path, line in places}


def finding_site(finding: Finding, rebase: Callable[[str], str], root: str) -> str | None:
    """The `--reach` label of a finding's line."""
    place = _place(finding, rebase)
    return label(place[0], root, place[1]) if place is not None else None


def _place(finding: Finding, rebase: Callable[[str], str]) -> tuple[str, int] | None:
    """The finding's written line: (its file as the project names it, the line), when the report has both."""
    m = finding.mutation
    if not m.file or m.line is None:
        return None
    return rebase(m.file), m.line


def edited_groups(changes: dict[str, tuple[bytes, bytes]], root: str) -> dict[str, tuple[str, frozenset[int]]]:
    """One `--reach` group per edited file: the lines the edits wrote (a move's deletion writes none)."""
    out: dict[str, tuple[str, frozenset[int]]] = {}
    for path, (before, after) in changes.items():
        lines = changed_lines(before, after)
        if lines:
            out[label(path, root, min(lines))] = (path, lines)
    return out


def did_the_work(verdict: Any, trial: _Run, reference: _Run, site: str | None) -> None:
    """Mark `verdict` unprovable when the runs did not do the work (`produced.unprovable`); where the
    values are equal, compare what else the program produced (its output, the files it wrote)."""
    verdict.unprovable = unprovable(trial, reference, site)
    if not verdict.unprovable and verdict.comparison == "equal":
        differs = produced_difference(trial, reference)
        if differs:
            verdict.comparison, verdict.first_difference = "differs", differs


def label(path: str, root: str, line: int) -> str:
    """A `--reach` group's label, as the recorder writes it: the path relative to the project, the line."""
    return f"{os.path.relpath(path, root)}:{line}"
