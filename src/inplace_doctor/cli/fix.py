"""`inplace-doctor fix SCRIPT.py [ARGS ...]`: run the script, make the edits its findings name, run it again.

The script runs under `inplace-doctor run` in a child process (so the second
run imports the edited files afresh). Only the fix templates whose meaning is
known are applied (`source_edits.py`); the others are printed as suggestions.
After a flag change (`inplace=True` -> `inplace=False`) the second run is
`run --verify`: each model the script ran is verified against its out-of-place
form, and `fix` says what that proves (and, from the findings, whether the
forward computes what it did before).
A file is edited only inside the working directory, never under the Python
installation (site-packages, torch), and only when git shows no uncommitted
change to it (`--force` to edit anyway). `--diff` prints the patch and writes
nothing.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from typing import TYPE_CHECKING, Any

from .errors import CliUsageError

if TYPE_CHECKING:
    from .args import Subcommands
    from .source_edits import Edit


def add_parser(sub: "Subcommands") -> None:
    fixer = sub.add_parser(
        "fix", help="apply the fixes a script's findings name as source edits, then run it again",
        usage="inplace-doctor fix [--diff] [--force] [--steps N] SCRIPT.py [ARGS ...]",
        description="Run SCRIPT.py under `inplace-doctor run`, make the source edits its findings name (a "
                    "`.clone()` before a write, `x += y` -> `x = x + y`, inplace=False at the constructing line), "
                    "then run it again and say whether the findings are gone; after a flag change, verify each model "
                    "the script runs against its out-of-place form. Other fixes are printed as suggestions.",
    )
    fixer.add_argument("--diff", action="store_true", help="print the patch; change no file")
    fixer.add_argument("--force", action="store_true", help="also edit files with uncommitted changes")
    fixer.add_argument("--steps", type=int, metavar="N", help="watch only the first N training steps (as run)")
    fixer.add_argument("target", nargs=argparse.REMAINDER, metavar="SCRIPT.py [ARGS ...]")
    fixer.set_defaults(handler=command)


def command(ns: argparse.Namespace) -> int:
    if not ns.target:
        raise CliUsageError("fix needs a script: inplace-doctor fix train.py [ARGS ...]")
    script, args = ns.target[0], list(ns.target[1:])
    if not os.path.isfile(script):
        raise CliUsageError(f"no script {script!r}: give a path to a .py file")
    try:
        import libcst  # noqa: F401
    except ImportError:
        raise CliUsageError("fix edits source with libcst, which is not installed: pip install 'inplace-doctor[fix]'") from None
    status, findings, stderr, _ = _run(script, args, ns.steps)
    if findings is None:
        sys.stderr.write(stderr)
        print(f"inplace-doctor: the script's run under inplace-doctor gave no report (exit {status})", file=sys.stderr)
        return status or 1
    edited: set[str] = set()  # files this command changed: later rounds may change them again
    flipped: list[dict[str, Any]] = []  # the findings whose flag fix was applied, in any round
    verified: list[dict[str, Any]] = []  # the report's `verify_results`: what decides "proven"
    for _ in range(_ROUNDS):
        edits, suggestions = _split(findings)
        if not edits:
            break
        patches = _patches(list(edits), check_committed=not (ns.diff or ns.force), exempt=edited)
        _show(patches)
        _suggest(suggestions)
        if ns.diff:
            return 1
        for path, (_, after) in patches.items():
            with open(path, "w", encoding="utf-8") as out:
                out.write(after)
            edited.add(path)
        for edit in edits:
            print(f"fixed {edit.describe()}")
        flipped += [f for edit, found in edits.items() if edit.kind in ("flag", "argument") for f in found]
        # once a flag changed, every later run verifies: the last one, with nothing left to edit, is the proof
        status, findings, stderr, verified = _run(script, args, ns.steps, verify=bool(flipped))
        if findings is None or status not in (0, 1):
            sys.stderr.write(stderr)
            print(f"inplace-doctor: after the edit the script failed (exit {status}): the edit is kept; "
                  "`git diff` shows it", file=sys.stderr)
            return status or 1
        if suggestions:
            break
    remaining = [f for f in findings if f.get("severity") in ("error", "warning")]
    if not edited:
        _suggest(suggestions)
        if not remaining:
            print("inplace-doctor: nothing to fix: no error or warning finding")
            return 0
        return 1
    proven = _proven(verified, flipped) if flipped and not any(f.get("severity") == "error" for f in remaining) else True
    if remaining:
        print(f"inplace-doctor: after the edits {len(remaining)} finding(s) remain:")
        for f in remaining:
            print(f"  {f['code']} {f.get('fix')}")
        return 1
    print("inplace-doctor: after the edit the script ran to the end with no finding")
    return 0 if proven else 1


def _suggest(suggestions: list[dict[str, Any]]) -> None:
    for f in suggestions:
        print(f"suggestion (not applied: its meaning depends on the program) {f['code']}: {f.get('fix')}")


# A run stops at the first in-place error backward reaches; the next one shows after it is fixed.
_ROUNDS = 5


def _split(findings: list[dict[str, Any]]) -> tuple[dict["Edit", list[dict[str, Any]]], list[dict[str, Any]]]:
    """(each distinct edit to make, with the findings that name it; the findings whose fix is only
    a suggestion)."""
    from .source_edits import edit_for

    edits: dict[Edit, list[dict[str, Any]]] = {}
    suggestions = []
    for f in findings:
        if f.get("severity") not in ("error", "warning"):
            continue
        edit = edit_for(f)
        if edit is None:
            suggestions.append(f)
        else:
            edits.setdefault(edit, []).append(f)  # a folded finding's places share one edit
    return edits, suggestions


def _patches(edits: list["Edit"], *, check_committed: bool, exempt: set[str]) -> dict[str, tuple[str, str]]:
    """path -> (text now, text after the edits), every file checked before any is written."""
    from .source_edits import EditError, apply_edits

    by_file: dict[str, list[Edit]] = {}
    for edit in edits:
        by_file.setdefault(os.path.realpath(edit.file), []).append(edit)
    patches: dict[str, tuple[str, str]] = {}
    for path, file_edits in by_file.items():
        _refuse_outside_project(path)
        if check_committed and path not in exempt:
            _refuse_uncommitted(path)
        with open(path, encoding="utf-8") as f:
            before = f.read()
        try:
            patches[path] = (before, apply_edits(before, file_edits))
        except EditError as e:
            raise CliUsageError(f"{path} changed since the run: {e}") from None
    return patches


def _show(patches: dict[str, tuple[str, str]]) -> None:
    for path, (before, after) in patches.items():
        shown = os.path.relpath(path)
        sys.stdout.writelines(difflib.unified_diff(
            before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{shown}", f"b/{shown}"
        ))


def _proven(verified: list[dict[str, Any]], flipped: list[dict[str, Any]]) -> bool:
    """Print what `run --verify` said of each model the edited script ran, and what that proves of
    the flag changes (`flipped`: the findings whose fix they were); whether it proves them. Decided
    on the report's `verify_results` records (`outcome`), never on the notes' wording."""
    for v in verified:
        print(f"inplace-doctor: {v.get('text', '')}")
    outside = sorted({f"{m['file']}:{m['line']}" for f in flipped if not (m := f.get("mutation") or {}).get("module")})
    equivalent = bool(verified) and all(v.get("outcome") == "equivalent" for v in verified)
    if not equivalent or outside:
        why = (
            f"the call(s) at {', '.join(outside)} run outside any module, which verify cannot run alone"
            if outside and equivalent
            else "no model ran while the script was watched" if not verified
            else "verify did not prove every model equivalent to its out-of-place form (above)"
        )
        print(f"inplace-doctor: the flag change is not proven: {why}; the edit is kept (`git diff` shows it)",
              file=sys.stderr)
        return False
    print("inplace-doctor: proven: as edited, every model the script ran computes exactly what its out-of-place "
          "form computes (outputs, loss, gradients, buffers and inputs of its first call), the program PyTorch "
          "holds in-place code to (the flags it flipped are out of place in both runs: what verify compared are the "
          "in-place sites that stay)")
    codes = {f["code"] for f in flipped}
    if "IPD105" in codes:
        print("inplace-doctor: this changes what the forward computes: before the edit a later op read the values "
              "the in-place write had changed (IPD105); now it reads the values the out-of-place form computes")
    else:
        print("inplace-doctor: the forward computes what it did before the edit (no op read a value the in-place "
              "write changed, or IPD105 would have said so); what is gone is the write itself")
    if "IPD106" in codes:
        print("inplace-doctor: the caller's tensor the write changed (IPD106) now keeps its values after the call")
    return True


def _run(
    script: str, args: list[str], steps: int | None, *, verify: bool = False
) -> tuple[int, list[dict[str, Any]] | None, str, list[dict[str, Any]]]:
    """(exit status, the findings of `inplace-doctor run` on the script or None, its stderr, the
    report's `verify_results`: with `verify`, what `run --verify` found of each model)."""
    with tempfile.TemporaryDirectory(prefix="inplace-doctor-fix-") as tmp:
        out = os.path.join(tmp, "report.json")
        argv = [sys.executable, "-m", "inplace_doctor", "run", "--format", "json", "--output", out]
        if steps is not None:
            argv += ["--steps", str(steps)]
        if verify:
            argv.append("--verify")
        done = subprocess.run([*argv, script, *args], capture_output=True, text=True)
        sys.stdout.write(done.stdout)  # the script's own output, as `run` leaves it
        try:
            with open(out, encoding="utf-8") as f:
                report = json.load(f)
            return done.returncode, report["findings"], done.stderr, list(report.get("verify_results", []))
        except (OSError, ValueError, KeyError):
            return done.returncode, None, done.stderr, []


def _refuse_outside_project(path: str) -> None:
    here = os.path.realpath(os.getcwd())
    installed = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("purelib", "platlib", "stdlib")}
    if any(path.startswith(os.path.join(p, "")) for p in installed) or not path.startswith(os.path.join(here, "")):
        raise CliUsageError(
            f"the fix is in {path}, outside this project ({here}): inplace-doctor fix edits only your own files; "
            "make that change by hand"
        )


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
