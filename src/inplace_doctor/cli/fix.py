"""`inplace-doctor fix SCRIPT.py [ARGS ...]`: apply the fixes a script's findings carry, once each is proven.

1. The script runs under `inplace-doctor run` (a child process, in the working
   directory, its output shown). Each finding's `fixes[]` in the JSON report
   are the candidates: `Edit` records built from the source, applied as data.
2. A fix is checked on a scratch copy of the project (`prove.py`): the edits
   made there, the script run again watched and recorded, and compared with
   the reference run, the original program with every saved tensor copied at
   save (the program the user meant). A fix is proven when its finding (every
   finding of its rule on its line) is gone, no new error or warning appears,
   and every forward output, gradient, parameter, optimizer state and buffer
   recorded equals the reference's bit for bit. For a flag change that alters
   what the forward computes (IPD105) the intended program is the out-of-place
   one, and the check is `run --verify`'s. A run stops at the first in-place
   error backward reaches: a fix whose program is equal as far as it runs and
   then stops at a finding no run had reached is kept, and that finding's fix
   is checked on top of it; the set is proven when the last run is.
3. Only a proven set is written (with `--unsafe-fixes`, also fixes whose
   finding goes but whose results differ: they are called unsafe, with the
   first value that differs). Files are written all or nothing, byte for byte
   (`source_edits.py`). `fixed` is printed only for a finding the edited
   program no longer has; no edit is made twice.

Refusals (one line, exit 2, nothing written): a file outside the working
directory or under the Python installation, a file not writable, a file with
uncommitted changes or not in git, or git missing (`--force` skips the git
checks), a file changed since the run. `--diff` prints the patch, byte for byte
as it would be written, and writes nothing.

Exit codes: 0 when the edits were written and the edited script ran to the end
with no error or warning finding (or there was nothing to fix); 1 when findings
remain, no fix was proven, or with `--diff`; 2 for a refusal.
"""

from __future__ import annotations

import argparse
import io
import os
from dataclasses import replace
import shutil
import subprocess
import sys
import sysconfig
import tokenize
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import CliUsageError

if TYPE_CHECKING:
    from ..findings import Edit, Fix
    from .args import Subcommands
    from .source_edits import Source
    from .prove import Identity, Run, Verdict, Workspace

# A run stops at the first in-place error backward reaches; the next one shows after it is fixed.
_ROUNDS = 8


def add_parser(sub: "Subcommands") -> None:
    fixer = sub.add_parser(
        "fix", help="apply the fixes a script's findings carry, each proven on a copy of your program first",
        usage="inplace-doctor fix [--diff] [--force] [--unsafe-fixes] [--steps N] SCRIPT.py [ARGS ...]",
        description="Run SCRIPT.py under `inplace-doctor run`; check each fix its findings carry on a copy of the "
                    "project (the finding gone, no new one, and forward values, gradients and optimizer state equal "
                    "bit for bit to the program with every saved tensor copied at save); apply the proven ones.",
    )
    fixer.add_argument("--diff", action="store_true", help="print the patch, byte for byte; change no file")
    fixer.add_argument("--force", action="store_true", help="skip git's checks (uncommitted changes, git missing)")
    fixer.add_argument("--unsafe-fixes", action="store_true",
                       help="also apply fixes whose finding goes but whose results are not proven equal")
    fixer.add_argument("--steps", type=int, metavar="N", help="watch only the first N training steps (as run)")
    fixer.add_argument("target", nargs=argparse.REMAINDER, metavar="SCRIPT.py [ARGS ...]")
    fixer.set_defaults(handler=command)


@dataclass
class Accepted:
    code: str
    where: str  # file:line of the write, as the run that found it named it
    target: "Identity"
    fix: "Fix"
    verdict: "Verdict"
    described: str


def command(ns: argparse.Namespace) -> int:
    from .prove import Workspace, serious
    from .source_edits import fixes_from_json

    if not ns.target:
        raise CliUsageError("fix needs a script: inplace-doctor fix train.py [ARGS ...]")
    script, args = ns.target[0], list(ns.target[1:])
    if not os.path.isfile(script):
        raise CliUsageError(f"no script {script!r}: give a path to a .py file")
    if ns.steps is not None and ns.steps < 1:
        raise CliUsageError(f"--steps must be at least 1, got {ns.steps}")
    if not (ns.diff or ns.force) and shutil.which("git") is None:
        raise CliUsageError("git is not on PATH, and fix edits only files git can give back: install git, see the "
                            "edit with --diff, or pass --force")
    root = os.path.realpath(os.getcwd())
    first = _watch(script, args, ns.steps)
    if first.report is None:
        sys.stderr.write(first.stderr)
        print(f"inplace-doctor: the script's run under inplace-doctor gave no report (exit {first.status})",
              file=sys.stderr)
        return first.status or 1
    targets = serious(first.findings)
    if first.status and not targets:  # the script failed on its own: its error as python prints it, its status
        sys.stderr.write(first.stderr)
        return first.status
    if not targets:
        print("inplace-doctor: nothing to fix: no error or warning finding")
        return 0
    editable = [f for f in targets if any(fx.edits for fx in fixes_from_json(f))]
    if not editable:
        print(f"inplace-doctor: {len(targets)} finding(s), none with an edit fix can make and check:")
        _suggest(targets, os.path.realpath(os.getcwd()))
        return 1
    _refuse(ns, root, {os.path.join(root, e.path) for f in editable for fx in fixes_from_json(f) for e in fx.edits})
    ws = Workspace(root, script, args, ns.steps)
    try:
        return _fix(ns, ws, first)
    finally:
        ws.close()


def _fix(ns: argparse.Namespace, ws: "Workspace", first: "Run") -> int:
    from .prove import How, identity, serious
    from .source_edits import EditError, plan, unified_diff, write_all

    reference = ws.run({}, reference=True)
    if reference.record is None or reference.record.how is not How.RAN:
        ended = reference.record.ended if reference.record is not None else "did not start"
        last = (reference.stderr.strip().splitlines() or [""])[-1]
        print(f"inplace-doctor: the script with every saved tensor copied at save (the program it means) {ended}"
              f"{f' ({last})' if last else ''}: no fix can be proven equal to it", file=sys.stderr)
    state: dict[str, bytes] = {}
    known = {identity(f, ws.root) for f in serious(first.findings)}
    findings, tree = first.findings, ws.root
    accepted: list[Accepted] = []
    rejected: list[str] = []
    tried: set[tuple[Any, ...]] = set()
    for _ in range(_ROUNDS):
        progress = False
        for f in serious(findings):
            target = identity(f, tree)
            where = _where(f, tree)
            for fx in _candidates(f):
                edits = tuple(_rebased(e, ws, tree) for e in fx.edits)
                key = (target, tuple((e.path, e.old, e.new) for e in edits))
                if key in tried:
                    continue
                tried.add(key)
                again = [e for e in edits if _already_made(e, state)]
                if again:
                    rejected.append(f"{f['code']} at {where}: its fix would insert `{_one_line(again[0].new)}` at "
                                    f"{_where_edit(again[0], ws.root)}, where that line already stands right above "
                                    "and the finding is still there: the same edit is not made twice")
                    continue
                try:
                    changes = plan(edits, ws.root, current=state)
                except EditError as e:
                    raise CliUsageError(str(e)) from None
                candidate = {**state, **{p: after for p, (_, after) in changes.items()}}
                print(f"inplace-doctor: checking the fix for {f['code']} at {where} on a copy of the project: "
                      f"{_describe(edits, ws.root, changes)}")
                flag = f["code"] == "IPD105"  # the intended program is the out-of-place one: verify's
                trial = ws.run(candidate, verify=flag)
                verdict = _verified(target, trial, known) if flag else _judge(target, trial, reference, known)
                if not (verdict.proven or verdict.on_the_way or (ns.unsafe_fixes and verdict.gone)):
                    rejected.append(f"{f['code']} at {where}: {_describe(edits, ws.root, changes)}: {_why_not(verdict)}")
                    continue
                accepted.append(Accepted(f["code"], where, target, replace(fx, edits=edits), verdict,
                                         _describe(edits, ws.root, changes)))
                state, findings, tree = candidate, trial.findings, trial.tree
                known |= {identity(g, tree) for g in serious(findings)}
                if flag and verdict.proven:  # what is meant from here on: the program with the flag off
                    reference = ws.run(state, reference=True)
                progress = True
                break
            if progress:
                break
        if not progress:
            break
    for line in rejected:
        print(f"inplace-doctor: not applied: {line}")
    left = serious(findings)
    if not accepted:
        _suggest(left, tree)
        print("inplace-doctor: no file was changed: no fix was proven")
        return 1
    proven = accepted[-1].verdict.proven and all(a.verdict.proven or a.verdict.on_the_way for a in accepted)
    if not proven and not ns.unsafe_fixes:
        print(f"inplace-doctor: nothing written: {_why_not(accepted[-1].verdict)}, so the edits so far are not "
              "proven; --unsafe-fixes applies them anyway")
        return 1
    changes = {p: (ws.original(p) or b"", data) for p, data in state.items()}
    _refuse(ns, ws.root, set(changes))
    if ns.diff:
        sys.stdout.flush()
        sys.stdout.buffer.write(unified_diff(changes, ws.root))
        sys.stdout.buffer.flush()
        return 1
    try:
        write_all(changes)
    except EditError as e:
        raise CliUsageError(str(e)) from None
    remaining = {identity(g, tree) for g in left}
    for a in accepted:
        if a.target in remaining:
            continue
        sure = _how_sure(a.code, accepted[-1].verdict) if proven else f"unsafe, applied by --unsafe-fixes: {_why_not(a.verdict)}"
        print(f"fixed {a.code} at {a.where}: {a.described} ({sure})")
    targeted = {a.target for a in accepted}
    for f in serious(first.findings):  # a sibling (another write to the same saved tensor) went with a fix
        if identity(f, ws.root) not in remaining | targeted:
            print(f"inplace-doctor: gone with the edits above: {f['code']} at {_where(f, ws.root)}")
    if left:
        print(f"inplace-doctor: after the edits {len(left)} finding(s) remain:")
        _suggest(left, tree)
        return 1
    print("inplace-doctor: the edited script ran to the end (in a copy of the project) with no finding")
    return 0 if proven else 1


def _candidates(finding: dict[str, Any]) -> list["Fix"]:
    from ..findings import Applicability
    from .source_edits import fixes_from_json

    return [fx for fx in fixes_from_json(finding) if fx.edits and fx.applicability is not Applicability.MANUAL]


def _rebased(edit: "Edit", ws: "Workspace", tree: str) -> "Edit":
    return replace(edit, path=ws.rebase(edit.path, tree))


def _already_made(edit: "Edit", state: dict[str, bytes]) -> bool:
    from .source_edits import Source, already_made

    path = os.path.realpath(edit.path)
    try:
        source = Source.of(state[path], path) if path in state else Source.read(path)
    except OSError:
        return False
    return already_made(edit, source)


def _where_edit(edit: "Edit", root: str) -> str:
    return f"{os.path.relpath(edit.path, root) if os.path.isabs(edit.path) else edit.path}:{edit.start.line}"


def _judge(target: "Identity", trial: "Run", reference: "Run", known: "set[Identity]") -> "Verdict":
    from .prove import How, Record, judge

    return judge(target, trial, reference.record or Record(How.NOT_STARTED, "", 0, ()), known)


def _verified(target: "Identity", trial: "Run", known: "set[Identity]") -> "Verdict":
    """An IPD105 flag change judged by `run --verify`: every model the edited script ran computes
    what its out-of-place form computes."""
    from .prove import How, Record, Verdict, identity, judge, serious

    verdict = judge(target, trial, Record(How.NOT_STARTED, "", 0, ()), known)  # for gone and new; the record is not the measure here
    report = trial.report or {}
    results = report.get("verify_results")  # `run --verify`'s verdicts as records: nothing reads its notes
    outcomes = [r.get("outcome") for r in results] if isinstance(results, list) else []
    outside = [f for f in serious(trial.findings) if identity(f, trial.tree) == target]
    ok = bool(outcomes) and all(o == "equivalent" for o in outcomes) and not outside
    return Verdict(verdict.gone, verdict.new, "equal" if ok else "differs",
                   "" if ok else ("no model ran while the script was watched" if not outcomes
                                  else "verify did not find every model equivalent to its out-of-place form"),
                   trial.record.steps if trial.record is not None else 0)


def _why_not(v: "Verdict") -> str:
    if not v.gone:
        return "the edited program still has the finding"
    if v.new:
        return f"the edited program reports {', '.join(v.new)}"
    return f"not equal to the intended program: {v.first_difference}"


def _how_sure(code: str, v: "Verdict") -> str:
    steps = f"{v.steps} step(s)" if v.steps else "the whole run"
    if code == "IPD105":
        return ("proven: the finding is gone, nothing new is reported, and every model the edited script ran computes "
                "exactly what its out-of-place form computes (run --verify); this changes what the forward computes: "
                "before the edit a later op read the values the in-place write had changed")
    return (f"proven: the finding is gone, nothing new is reported, and the edited program's forward outputs, "
            f"gradients and state over {steps} equal the intended program's bit for bit")


def _describe(edits: tuple["Edit", ...], root: str, changes: dict[str, tuple[bytes, bytes]]) -> str:
    """The edits in words: a change inside one line shows the whole line before and after."""
    from .source_edits import Source

    parts = []
    for e in edits:
        where = _where_edit(e, root)
        old, new = _one_line(e.old), _one_line(e.new)
        before_after = changes.get(os.path.realpath(e.path))
        if e.start.line == e.end.line and "\n" not in e.new and old and before_after is not None:
            lines = [Source.of(data, e.path) for data in before_after]
            old, new = (_line(src, e.start.line) for src in lines)
        if not old:
            parts.append(f"insert `{new}` at {where}")
        elif not new:
            parts.append(f"delete `{old}` at {where}")
        else:
            parts.append(f"replace `{old}` with `{new}` at {where}")
    return "; ".join(parts)


def _line(source: "Source", number: int) -> str:
    starts = source.line_starts()
    end = starts[number] if number < len(starts) else len(source.data)
    line = source.data[starts[number - 1] : end].decode(source.encoding, "replace").strip()
    try:  # the statement without its comment
        for token in tokenize.generate_tokens(io.StringIO(line).readline):
            if token.type == tokenize.COMMENT:
                return line[: token.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError):
        pass
    return line


def _one_line(code: str) -> str:
    """Statements on several lines shown on one, as Python would accept them: `a = f(b); b = a`."""
    return "; ".join(line.strip() for line in code.splitlines() if line.strip())


def _where(finding: dict[str, Any], tree: str) -> str:
    m = finding.get("mutation") or {}
    file = m.get("file") or "?"
    return f"{os.path.relpath(file, tree) if os.path.isabs(file) else file}:{m.get('line')}"


def _suggest(findings: list[dict[str, Any]], tree: str) -> None:
    for f in findings:
        print(f"  {f['code']} at {_where(f, tree)}: {f.get('fix')}")


def _watch(script: str, args: list[str], steps: int | None) -> "Run":
    """The script under `inplace-doctor run` in the working directory, its output shown."""
    import tempfile

    from .prove import Run, _load

    with tempfile.TemporaryDirectory(prefix="inplace-doctor-fix-") as tmp:
        out = os.path.join(tmp, "report.json")
        argv = [sys.executable, "-m", "inplace_doctor", "run", "--format", "json", "--output", out]
        argv += ["--steps", str(steps)] if steps is not None else []
        done = subprocess.run([*argv, script, *args], capture_output=True, text=True)
        sys.stdout.write(done.stdout)  # the script's own output, as `run` leaves it
        return Run(done.returncode, _load(out), None, done.stderr, os.path.realpath(os.getcwd()))


def _refuse(ns: argparse.Namespace, root: str, paths: set[str]) -> None:
    """One usage line (exit 2) for the first file fix must not write; nothing is written before."""
    installed = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("purelib", "platlib", "stdlib")}
    for path in sorted(os.path.realpath(p) for p in paths):
        if any(path.startswith(os.path.join(p, "")) for p in installed) or not path.startswith(os.path.join(root, "")):
            raise CliUsageError(f"the fix is in {path}, outside this project ({root}): inplace-doctor fix edits only "
                                "your own files; make that change by hand")
        if ns.diff:
            continue
        if not os.access(path, os.W_OK) or not os.access(os.path.dirname(path), os.W_OK):
            raise CliUsageError(f"{os.path.relpath(path)} is not writable (nor its folder): fix writes the edited file "
                                "beside it and renames it over; see the edit with --diff")
        if not ns.force:
            _refuse_uncommitted(path)


def _refuse_uncommitted(path: str) -> None:
    folder = os.path.dirname(path)
    tracked = subprocess.run(["git", "ls-files", "--error-unmatch", path], cwd=folder, capture_output=True)
    if tracked.returncode != 0:
        raise CliUsageError(f"{os.path.relpath(path)} is not committed to git, so the edit could not be undone: "
                            "commit it first, see the edit with --diff, or pass --force")
    changed = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", path], cwd=folder, capture_output=True)
    if changed.returncode != 0:
        raise CliUsageError(f"{os.path.relpath(path)} has uncommitted changes: commit them first, see the edit with "
                            "--diff, or pass --force")
