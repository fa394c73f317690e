"""Checking a fix on the user's own program before `fix` offers it as proven.

A `Workspace` is a scratch copy of the project (the working directory, without
`.git`, caches and virtual environments). Each run happens in a fresh copy of
it, so the program sees the files it started with and writes its checkpoints
there, never into the user's folder:
- the reference run: the program as it is, with every tensor autograd saves
  copied at save (`recorder.py`): what the user meant, recorded;
- a trial: the program with a set of edits, under `inplace-doctor run`,
  recorded the same way, with its findings.
`judge` compares a trial with the reference: the finding (every finding of its
rule on its line) gone, no error or warning that no earlier run showed, and
every recorded value equal bit for bit.
"""

from __future__ import annotations

import enum
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ...findings import Finding, Severity
from ...report import Report
from ..errors import CliUsageError
from .copy_room import check_room, links_into_the_copy, skip
from .produced import stamps, written
from .proof_seeds import HASH_SEED


class How(enum.StrEnum):
    """How a recorded run ended (its value is also how it reads)."""

    NOT_STARTED = "did not start"
    RAN = "ran to the end"
    EXITED = "exit"     # with a non-zero status
    RAISED = "raised"   # with an exception, named in `Record.detail`


@dataclass(frozen=True)
class Record:
    """What one run computed: its fingerprints in order, each (stream, label, value), how it ended,
    and the training steps it took (the most steps of one optimizer, or backward passes without one)."""

    how: How
    detail: str  # the exit status, or the exception's type
    steps: int
    entries: tuple[tuple[str, str, str], ...]
    #: (kind, function, file, line): the first of the program's own calls of each thing seeds do not
    #: fix (`proof_seeds.Unseeded`), in the order they came
    unseeded: tuple[tuple[str, str, str, int], ...] = ()
    #: (what, path or command): what the run was refused outside its copy (`confine.py`)
    refused: tuple[tuple[str, str], ...] = ()
    #: the `--reach` groups (`FILE:LINE`) it never ran a line of (`reach.py`)
    unreached: tuple[str, ...] = ()

    @property
    def ran(self) -> bool:  # to its end, exit 0
        return self.how is How.RAN

    @property
    def ended(self) -> str:
        """How it ended, in words (display only: decisions read `how`)."""
        return f"{self.how} {self.detail}" if self.detail else str(self.how)

    def streams(self) -> dict[str, list[tuple[str, str, int]]]:
        """The (label, value, place in the run) entries of each stream (`recorder.py`), in order;
        streams in the order they start. Entries compare by label and value (`judge`)."""
        out: dict[str, list[tuple[str, str, int]]] = {}
        for n, (stream, label, value) in enumerate(self.entries):
            out.setdefault(stream, []).append((label, value, n))
        return out


@dataclass
class Run:
    """One child run: exit status, the JSON report (None when there was none), the record; what
    it printed (`out`, `err`: bytes, the tool's own `inplace-doctor` lines left out of `err`) and
    the files it wrote in its copy (path relative to the copy -> a digest, or "deleted")."""

    status: int
    report: Report | None  # the child's JSON report, read back as records (`Report.from_dict`)
    record: Record | None
    stderr: str = ""
    tree: str = ""
    out: bytes = b""
    err: bytes = b""
    written: dict[str, str] = field(default_factory=dict)

    @property
    def findings(self) -> list[Finding]:
        return list(self.report.findings) if self.report is not None else []


class Identity(NamedTuple):
    """A finding named so that runs of two copies, edited differently, agree (`identity`)."""

    code: str  # the rule
    path: str  # the file, relative to the project
    text: str  # the written line's text, whitespace runs as one space (what a message shows)
    line: int  # that line in the program as fix started, followed through the edits; 0: a line the edits wrote


def identity(finding: Finding, tree: str, lines: Mapping[str, Sequence[int]] | None = None) -> Identity:
    """A finding named so that two runs in two copies agree: its rule, its file relative to the
    copy, the text of the line that wrote, and which line that is. Line numbers move when an edit
    inserts a line, so the line is the one the program had before any edit: `lines` maps each
    line of a file the edits changed (by its path relative to the project) to that line, 0 for a
    line they wrote (`edited_lines.origins`). Two lines of one text (`h.mul_(2)` in two modules'
    forwards) are two findings; a line an edit rewrote keeps its number (its text is the edit's)."""
    m = finding.mutation
    file = m.file or ""
    rel = os.path.relpath(file, tree) if os.path.isabs(file) else file
    line = m.line or 0
    followed = lines.get(os.path.normpath(rel)) if lines else None
    if followed is not None:
        line = followed[line - 1] if 0 < line <= len(followed) else 0
    return Identity(finding.code, rel, " ".join(str(m.code or m.line).split()), line)


def serious(findings: list[Finding]) -> list[Finding]:
    """The errors and warnings: what `fix` fixes and what a trial must not add."""
    return [f for f in findings if f.severity.rank >= Severity.WARNING.rank]


@dataclass
class Verdict:
    """What a trial showed of one fix."""

    gone: bool
    new: list[Identity] = field(default_factory=list)  # errors/warnings no earlier run showed
    comparison: str = "differs"  # "equal", "prefix" (equal until the trial stopped at a new error), "differs"
    first_difference: str = ""
    steps: int = 0
    unprovable: str = ""  # why the runs prove nothing whatever their values (`produced.unprovable`)

    @property
    def proven(self) -> bool:
        return self.gone and not self.new and self.comparison == "equal" and not self.unprovable

    @property
    def on_the_way(self) -> bool:
        """Equal as far as it ran, stopped by another finding's error (the next to fix)."""
        return self.gone and self.comparison == "prefix" and not self.unprovable


def judge(target: Identity, trial: Run, reference: Record, known: set[Identity], *,
          also: frozenset[Identity] = frozenset(), was: int = 1, lines: Mapping[str, Sequence[int]] | None = None) -> Verdict:
    """`also`: the target as the edits renamed it (its line rewritten: `h.mul_(2); g.mul_(3)` reads
    `h = h.mul(2); g.mul_(3)`); `was`: how many findings had the target's name before (two writes
    on one line share it). The target is gone when fewer are left under either name. `lines`: the
    trial's lines followed back to the program's (`identity`)."""
    found = [identity(f, trial.tree, lines) for f in serious(trial.findings)]
    ids, names = set(found), {target} | also
    new = sorted(i for i in ids if i not in known)
    left = sum(i in names for i in found)
    verdict = Verdict(gone=left < was, new=new)
    record = trial.record
    if record is None:
        verdict.first_difference = "the edited program left no record (it did not start)"
        return verdict
    verdict.steps = record.steps
    want_streams, got_streams = reference.streams(), record.streams()
    shorter = False
    if (record.how, record.detail) != (reference.how, reference.detail):  # stopped early: its end state is not the end of the program
        want_streams.pop("end", None)
        got_streams.pop("end", None)
    # the difference that came first in the edited program's run, whichever stream holds it
    differences: list[tuple[int, str]] = []
    for stream, want in want_streams.items():
        got = got_streams.get(stream, [])
        at = next((n for n, (w, g) in enumerate(zip(want, got)) if w[:2] != g[:2]), None)
        if at is not None:
            w, g = want[at], got[at]
            differences.append((g[2], f"{g[0]} differs from the intended program's" if w[0] == g[0]
                                else f"the intended program recorded {w[0]} where the edited one recorded {g[0]}"))
        elif len(got) > len(want):
            differences.append((got[len(want)][2], f"the edited program recorded more: {got[len(want)][0]}"))
        shorter = shorter or len(got) < len(want)
    if differences:
        verdict.first_difference = min(differences)[1]
        return verdict
    extra = [s for s in got_streams if s not in want_streams]
    if extra:
        verdict.first_difference = f"the edited program recorded {got_streams[extra[0]][0][0]}, the intended one did not"
    elif not shorter and (record.how, record.detail) == (reference.how, reference.detail):  # every stream, the end included, equal
        verdict.comparison = "equal"
    elif shorter and record.how is How.RAISED and (others := ids - names if not left else ids):
        # stopped by another finding (one no run had reached, or one reported and not yet fixed)
        stop = sorted(others, key=lambda i: (i in known, i))[0]
        verdict.comparison = "prefix"
        verdict.first_difference = f"the edited program stopped at {stop.code} at {stop.path}: {stop.text} (the next finding to fix)"
    else:
        verdict.first_difference = f"the edited program {record.ended}; the intended one {reference.ended}"
    return verdict


class Workspace:
    """A scratch copy of the project at `root`, and runs of the program in fresh copies of it."""

    def __init__(self, root: str, script: str, args: list[str], steps: int | None, *, module: bool = False,
                 options: tuple[str, ...] = ()) -> None:
        """`script` is a path (or, with `module`, a module run as `python -m` runs it, from the copy);
        `options` are more `inplace-doctor run` options for the trials (`--select ...`)."""
        self.root = os.path.realpath(root)
        check_room(self.root)
        self.module, self.options = module, options
        self.script = script if module else os.path.realpath(os.path.join(self.root, script))
        self.args, self.steps = args, steps
        self.tmp = tempfile.mkdtemp(prefix="inplace-doctor-fix-")
        self.base = os.path.join(self.tmp, "base")
        try:
            shutil.copytree(self.root, self.base, symlinks=True, ignore=skip)
        except shutil.Error as e:  # a file that cannot be read (permissions): one line, the copy gone
            self.close()
            source, _, why = e.args[0][0] if e.args and e.args[0] else ("", "", str(e))
            raise CliUsageError(f"cannot copy the project to check the fixes on: {why}"
                                f"{f' ({os.path.relpath(source, self.root)})' if source else ''}") from None
        links_into_the_copy(self.root, self.base)
        self._count = 0

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def original(self, path: str) -> bytes | None:
        """The bytes `path` (under the project) held when fix started."""
        try:
            with open(os.path.join(self.base, os.path.relpath(path, self.root)), "rb") as f:
                return f.read()
        except OSError:
            return None

    def run(self, state: Mapping[str, bytes], *, reference: bool = False, verify: bool = False,
            reach: Mapping[str, tuple[str, frozenset[int]]] | None = None) -> Run:
        """The program with `state`'s files (absolute paths under the project -> bytes), in a fresh
        copy: the reference run, or a trial under `inplace-doctor run` (with `verify`: `run --verify`).
        `reach`: groups of lines (`FILE:LINE` -> (path under the project, lines)) the run should
        reach; the record names those it did not (`Record.unreached`)."""
        self._count += 1
        tree = os.path.join(self.tmp, f"run{self._count}")
        own = os.path.join(self.tmp, f"own{self._count}")  # the child's record, report and TMPDIR
        os.makedirs(os.path.join(own, "tmp"))
        shutil.copytree(self.base, tree, symlinks=True)
        for path, data in state.items():
            with open(os.path.join(tree, os.path.relpath(path, self.root)), "wb") as f:
                f.write(data)
        before = stamps(tree)
        record_path = os.path.join(own, "record.json")
        report_path = os.path.join(own, "report.json")
        program = ["-m", self.script] if self.module else [os.path.join(tree, os.path.relpath(self.script, self.root))]
        argv = [sys.executable, "-m", "inplace_doctor.cli.proof.recorder", "--record", record_path, "--allow", own]
        for path, lines in (reach or {}).values():
            argv += ["--reach", f"{os.path.relpath(path, self.root)}:{','.join(map(str, sorted(lines)))}"]
        if reference:
            argv += ["--reference", "--", *program, *self.args]
        else:
            argv += ["--", "--format", "json", "--output", report_path, *self.options]
            argv += ["--steps", str(self.steps)] if self.steps is not None else []
            argv += ["--verify"] if verify else []
            argv += [*program, *self.args]
        env = self._environment(tree)
        env["TMPDIR"] = os.path.join(own, "tmp")  # tempfile's folder: the one outside the copy it may write
        # compile caches there too (torch sets TORCHINDUCTOR_CACHE_DIR in the process that first asks for
        # it, and children inherit it): a cache is no output of the program's
        for cache in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
            env[cache] = os.path.join(own, "tmp", cache.lower())
        done = subprocess.run(argv, cwd=tree, capture_output=True, env=env)
        err = b"".join(line for line in done.stderr.splitlines(keepends=True) if not line.startswith(b"inplace-doctor"))
        run = Run(done.returncode, load_report(report_path), None, done.stderr.decode("utf-8", "replace"), tree,
                  done.stdout, err, written(tree, before, {os.path.relpath(p, self.root) for p in state}))
        raw = _load(record_path)
        if raw is not None:
            run.record = Record(How(raw["how"]), str(raw["detail"]), int(raw["steps"]),
                                tuple((str(a), str(b), str(c)) for a, b, c in raw["entries"]),
                                tuple((str(k), str(c), str(f), int(n)) for k, c, f, n in raw.get("unseeded", ())),
                                tuple((str(w), str(p)) for w, p in raw.get("refused", ())),
                                tuple(str(label) for label in raw.get("unreached", ())))
        shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(own, ignore_errors=True)
        return run

    def _environment(self, tree: str) -> dict[str, str]:
        """The environment of a run in `tree`: `PYTHONPATH` folders inside the project point into the
        copy (a `src/` layout, a `-m` package), so the copy's edited files are the ones imported."""
        env = dict(os.environ)
        env.setdefault("PYTHONHASHSEED", HASH_SEED)  # every run iterates sets of strings alike (`proof_seeds.py`)
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # no `.pyc` beside an installed library: a write outside the copy
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(self._in_copy(p, tree) for p in paths)
        return env

    def _in_copy(self, path: str, tree: str) -> str:
        real = os.path.realpath(path)
        if real == self.root or real.startswith(os.path.join(self.root, "")):
            return os.path.join(tree, os.path.relpath(real, self.root))
        return path

    def rebase(self, path: str, tree: str) -> str:
        """An edit's path as a trial's report names it, as the path in the user's project."""
        if os.path.isabs(path):
            rel = os.path.relpath(path, tree)
            return os.path.join(self.root, rel) if not rel.startswith("..") else path
        return os.path.join(self.root, path)


def _load(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def load_report(path: str) -> Report | None:
    """The JSON report a child wrote at `path`, as records; None when it wrote none (or not whole)."""
    data = _load(path)
    try:
        return Report.from_dict(data) if data is not None else None
    except (KeyError, TypeError, ValueError):  # cut short (the child was killed mid-write)
        return None
