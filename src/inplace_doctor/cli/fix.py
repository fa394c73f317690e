"""`inplace-doctor fix (SCRIPT.py | -m MODULE) [ARGS ...]`: apply the fixes a script's findings carry, once each is proven.

1. The script (or module) runs under `inplace-doctor run` (a child process, in the working
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
directory or under the Python installation, a file not writable or read-only
(no write permission bit, even for root), a file with
uncommitted changes or not in git, or git missing (`--force` skips the git
checks), a file changed since the run. `--diff` prints the patch, byte for byte
as it would be written (`git apply` takes it), and writes nothing: stdout is the
patch alone, the script's output and fix's own lines go to stderr, with each fix
in the patch and whether the patch is proven (unproven only with `--unsafe-fixes`).

Exit codes: 0 when the edits were written and the edited script ran to the end
with no error or warning finding (or there was nothing to fix); 1 when findings
remain, no fix was proven, or with `--diff`; 2 for a refusal; 3 when a model
factory raises (its traceback, as `audit` shows it). The script's own non-zero
status wins, said after fix's own lines (`fix_exit.py`): `sys.exit(5)` is 5, a
death by SIGTERM 143. The script's output is passed on byte for byte.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import sysconfig
from typing import TYPE_CHECKING, TextIO

from ..printing import write_bytes
from ..render.fix_text import unproven_caveat
from .errors import CliUsageError, child_exit, ended_by
from .proof.fix_search import where_written

if TYPE_CHECKING:
    from ..findings import Finding
    from .args import Subcommands
    from .proof.fix_exit import Watched
    from .proof.fix_search import Search
    from .proof.prove import Identity, Run, Verdict


# A model factory runs as this module (not imported here: `run -m` runs it as __main__ in the child).
ENTRY = "inplace_doctor.cli.proof.model_entry"


def looks_like_spec(target: str) -> bool:
    """`pkg.mod:factory`, as `audit` takes it (a path to a script is never one)."""
    module, _, factory = target.partition(":")
    return bool(module and factory) and not target.endswith(".py") and "/" not in module


def add_parser(sub: Subcommands) -> None:
    fixer = sub.add_parser(
        "fix", help="apply the fixes a script's findings carry, each proven on a copy of your program first",
        usage="inplace-doctor fix [--diff] [--force] [--unsafe-fixes] [--steps N] "
              "(SCRIPT.py | -m MODULE | PKG.MODULE:FACTORY --input SHAPE) [ARGS ...]",
        description="Run SCRIPT.py (or -m MODULE) under `inplace-doctor run`; check each fix its findings carry on a "
                    "copy of the project (the finding gone, no new one, and forward values, gradients and optimizer "
                    "state equal bit for bit to the program with every saved tensor copied at save); apply the proven "
                    "ones. A model factory (as `audit` takes it, with --input, --eval, --seed) runs once forward "
                    "and backward of the sum of its outputs. For a report with the proven fixes marked (JSON, SARIF for code scanning) and no file "
                    "changed: `inplace-doctor run --prove`.",
    )
    fixer.add_argument("--diff", action="store_true", help="print the patch, byte for byte, alone on stdout (the rest on stderr); change no file")
    fixer.add_argument("--force", action="store_true", help="skip git's checks (uncommitted changes, git missing)")
    fixer.add_argument("--unsafe-fixes", action="store_true",
                       help="also apply fixes whose finding goes but whose results are not proven equal")
    fixer.add_argument("--steps", type=int, metavar="N", help="watch only the first N training steps (as run)")
    fixer.add_argument("-m", dest="module", metavar="MODULE",
                       help="run a module, as python -m does (from the copy of the project, for each check)")
    fixer.add_argument("target", nargs=argparse.REMAINDER, metavar="SCRIPT.py [ARGS ...]")
    fixer.set_defaults(handler=command)


def command(ns: argparse.Namespace) -> int:
    if not ns.diff:
        return _command(ns, sys.stdout)
    patch = sys.stdout  # the patch alone (`fix --diff train.py > fix.patch`): the script's output and ours to stderr
    with contextlib.redirect_stdout(sys.stderr):
        return _command(ns, patch)


def _command(ns: argparse.Namespace, patch: TextIO) -> int:
    from .project import load_project_config
    from .proof.fix_exit import Watched
    from .proof.prove import serious

    if ns.module:
        script, args = ns.module, list(ns.target)
    elif ns.target and not os.path.isfile(ns.target[0]) and looks_like_spec(ns.target[0]):
        ns.module, script, args = ENTRY, ENTRY, list(ns.target)  # a model factory, run as a program
    elif ns.target:
        script, args = ns.target[0], list(ns.target[1:])
        if not os.path.isfile(script):
            raise CliUsageError(f"no script {script!r}: give a path to a .py file, or -m MODULE")
    else:
        raise CliUsageError("fix needs a script: inplace-doctor fix train.py [ARGS ...] or -m MODULE [ARGS ...]")
    if ns.steps is not None and ns.steps < 1:
        raise CliUsageError(f"--steps must be at least 1, got {ns.steps}")
    if not (ns.diff or ns.force) and shutil.which("git") is None:
        raise CliUsageError("git is not on PATH, and fix edits only files git can give back: install git, see the "
                            "edit with --diff, or pass --force")
    load_project_config()  # a pyproject.toml that cannot be read: one line now, not the child's after the script
    root = os.path.realpath(os.getcwd())
    first = _watch(["-m", script] if ns.module else [script], args, ns.steps)
    status = child_exit(first.status)
    if first.report is None:
        _pass_stderr(first.stderr)
        print(f"inplace-doctor: the script's run under inplace-doctor {ended_by(first.status)} before it gave a "
              "report", file=sys.stderr)
        return status or 1
    targets = serious(first.findings)
    if status and not targets:  # the script failed on its own: its error as python prints it, its status
        _pass_stderr(first.stderr)
        return status
    if not targets:
        print("inplace-doctor: nothing to fix: no error or warning finding")
        return 0
    edited = [e for f in targets for fx in f.fixes for e in fx.edits]
    if not edited:
        print(f"inplace-doctor: {len(targets)} finding(s), none with an edit fix can make and check:")
        _suggest(targets, root)
        return _as_it_is(first)
    _refuse(ns, root, {os.path.join(root, e.path) for e in edited})
    ws = Watched(root, script, args, ns.steps, module=bool(ns.module))
    try:
        return _fix(ns, ws, first, patch)
    finally:
        ws.close()


def _fix(ns: argparse.Namespace, ws: Watched, first: Run, patch: TextIO) -> int:
    from .proof.fix_search import search, why_not
    from .proof.prove import identity
    from .proof.source_edits import EditError, unified_diff, write_all

    found = search(ws, first, unsafe=ns.unsafe_fixes, say=print)
    if found.reference_failed and not found.proven:  # proven: the edited program ends as the reference did
        print(f"inplace-doctor: {found.reference_failed}", file=sys.stderr)
    for line in found.rejected:
        print(f"inplace-doctor: not applied: {line}")
    accepted, left, tree = found.accepted, found.left, found.tree
    if not accepted:
        _suggest(left, tree)
        print("inplace-doctor: no file was changed: no fix was proven")
        return _as_it_is(first)
    proven = found.proven
    if not proven and not ns.unsafe_fixes:
        print(f"inplace-doctor: nothing written: {why_not(accepted[-1].verdict)}, so the edits so far are not "
              "proven; --unsafe-fixes applies them anyway")
        return _as_it_is(first)
    changes = {p: (ws.original(p) or b"", data) for p, data in found.state.items()}
    _refuse(ns, ws.root, set(changes))
    remaining = {identity(g, tree, found.lines) for g in left}
    made = [(a, _how_sure(a.code, accepted[-1].verdict) if proven
             else f"unsafe, {'in the patch' if ns.diff else 'applied'} by --unsafe-fixes: {why_not(a.verdict)}"
             f"{unproven_caveat(a.fix, a.code)}")
            for a in accepted if a.target not in remaining]
    if ns.diff:  # stdout is the patch alone: whether it is proven is said here, on stderr
        for a, sure in made:
            print(f"in the patch: {a.code} at {a.where}: {a.described} ({sure})")
        print("inplace-doctor: the patch on stdout is proven (nothing was written)" if proven else
              f"inplace-doctor: the patch on stdout is NOT proven: {why_not(accepted[-1].verdict)}; it is printed "
              "because of --unsafe-fixes (nothing was written)")
        write_bytes(patch, unified_diff(changes, ws.root))  # a full disk: one line, exit 2 (main)
        return _as_it_is(first)
    try:
        write_all(changes)
    except EditError as e:
        raise CliUsageError(str(e)) from None
    for a, sure in made:
        print(f"fixed {a.code} at {a.where}: {a.described} ({sure})")
    return _written(ws, first, found, remaining)


def _written(ws: Watched, first: Run, found: Search, remaining: set[Identity]) -> int:
    """After the edits are written: the findings that went with them, what the edited script's run
    ended as, and fix's exit status (`remaining`: the identities of the findings no fix took)."""
    from .proof.fix_exit import edited_end, passed_on
    from .proof.prove import identity, serious

    accepted, left, tree, proven = found.accepted, found.left, found.tree, found.proven
    targeted = {a.target for a in accepted}
    for f in serious(first.findings):  # a sibling (another write to the same saved tensor) went with a fix
        if identity(f, ws.root) not in remaining | targeted:
            print(f"inplace-doctor: gone with the edits above: {f.code} at {where_written(f, ws.root)}")
    end, how = edited_end(ws, tree)
    if left:
        print(f"inplace-doctor: after the edits {len(left)} finding(s) remain:")
        _suggest(left, tree)
        if end > 1:
            print(passed_on(end, "the edited script (in a copy of the project)", how))
        return end or 1
    if end:
        print("inplace-doctor: the edited script reported no finding (in a copy of the project)")
        print(passed_on(end, "the edited script", how))
        return end
    print("inplace-doctor: the edited script ran to the end (in a copy of the project) with no finding")
    return 0 if proven else 1


def _as_it_is(first: Run) -> int:
    """Fix's exit when it wrote nothing: 1, or the script's own status under `run` (said in a line
    after fix's own) when that is another (1 is also `run`'s word for the findings themselves)."""
    from .proof.fix_exit import passed_on

    status = child_exit(first.status)
    if status > 1:
        print(passed_on(status, "the script as it is", f"exited {status} under inplace-doctor run"))
    return status or 1


def _how_sure(code: str, v: Verdict) -> str:
    steps = f"{v.steps} step(s)" if v.steps else "the whole run"
    if code == "IPD105":
        return ("proven: the finding is gone, nothing new is reported, and every model the edited script ran computes "
                "exactly what its out-of-place form computes (run --verify); this changes what the forward computes: "
                "before the edit a later op read the values the in-place write had changed")
    return (f"proven: the finding is gone, nothing new is reported, and the edited program's forward outputs, "
            f"gradients and state over {steps} equal the intended program's bit for bit")


def _suggest(findings: list[Finding], tree: str) -> None:
    for f in findings:
        print(f"  {f.code} at {where_written(f, tree)}: {f.fix}")


def _watch(program: list[str], args: list[str], steps: int | None) -> Run:
    """The script (`[SCRIPT]` or `["-m", MODULE]`) under `inplace-doctor run` in the working
    directory, its output shown."""
    import tempfile

    from .proof.prove import Run, load_report

    with tempfile.TemporaryDirectory(prefix="inplace-doctor-fix-") as tmp:
        out = os.path.join(tmp, "report.json")
        argv = [sys.executable, "-m", "inplace_doctor", "run", "--format", "json", "--output", out]
        argv += ["--steps", str(steps)] if steps is not None else []
        done = subprocess.run([*argv, *program, *args], capture_output=True)  # bytes: a script's output need not be text
        write_bytes(sys.stdout, done.stdout)  # the script's own output, byte for byte, as `run` leaves it
        stderr = done.stderr.decode("utf-8", "surrogateescape")  # `_pass_stderr` gives back the same bytes
        return Run(done.returncode, load_report(out), None, stderr, os.path.realpath(os.getcwd()))


def _pass_stderr(text: str) -> None:
    """The first run's stderr (the script's own, and its traceback) passed on byte for byte."""
    write_bytes(sys.stderr, text.encode("utf-8", "surrogateescape"))


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
        mode = os.stat(path).st_mode
        if not mode & 0o222:  # made read-only on purpose: root may write it, and fix does not
            raise CliUsageError(f"{os.path.relpath(path)} is read-only (mode {mode & 0o7777:04o}): fix changes no file "
                                "made read-only; make it writable (chmod u+w) to have it edited, or see the edit with --diff")
        if not ns.force:
            _refuse_uncommitted(path)


def _refuse_uncommitted(path: str) -> None:
    """Exit status 1 is git's answer (not tracked; changed); any other is git failing to answer
    (no repository, a repository git will not read as this user, no commit yet): its own words."""
    folder, shown = os.path.dirname(path), os.path.relpath(path)
    tracked = subprocess.run(["git", "ls-files", "--error-unmatch", path], cwd=folder, capture_output=True, text=True)
    if tracked.returncode == 1:
        raise CliUsageError(f"{shown} is not committed to git, so the edit could not be undone: commit it first, see "
                            "the edit with --diff, or pass --force")
    if tracked.returncode == 0:
        changed = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", path], cwd=folder, capture_output=True, text=True)
        if changed.returncode == 1:
            raise CliUsageError(f"{shown} has uncommitted changes: commit them first, see the edit with --diff, or "
                                "pass --force")
        if changed.returncode == 0:
            return
        tracked = changed
    said = (tracked.stderr.strip().splitlines() or [f"exit {tracked.returncode}"])[0]
    raise CliUsageError(f"git cannot say whether {shown} is committed ({said}), so the edit might not be undone: "
                        "see the edit with --diff, or pass --force")
