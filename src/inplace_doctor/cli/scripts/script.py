"""`inplace-doctor run`: a user's script (or `-m module`) run as `python` would, under watch().

- The script sees the arguments after its path, unchanged, in `sys.argv`;
  `sys.path[0]` is its folder (for `-m`, the working directory), and it runs
  as `__main__`.
- The report goes to stderr, so the script's own stdout is intact; with
  `--output FILE` it goes to FILE only, and the tool prints nothing. The script
  gets `sys.stdout`/`sys.stderr` as python gives them; the report goes to the
  streams the tool was started with, whatever the script did to them (closed,
  replaced, None), and so does the script's own traceback.
- `--steps N` watches the first N training steps and then stops watching: the
  rest of the script runs at full speed. What counts as a step:
  - an optimizer step (`step()` of any `torch.optim.Optimizer`, seen through
    PyTorch's global step hooks, removed on exit), once one has been seen;
  - before the first optimizer step, a backward pass (`Tensor.backward`,
    `torch.autograd.backward`, `torch.autograd.grad`; only the outermost call
    counts). At the first optimizer step the count becomes the number of
    optimizer steps (1), so a loop of backward-then-step is counted in
    optimizer steps and each step's update is watched.
  - Backward passes inside an optimizer step (LBFGS's closure) are part of it.
  - When N backward passes come before any optimizer step, watching goes on
    until an optimizer step ends (from then on optimizer steps are counted,
    up to N) or the next backward pass starts (watching stops there: N
    backward passes watched, as in gradient accumulation over more than N
    micro-batches).
  A script that never calls an optimizer is counted in backward passes. The
  report's last line says which was counted.
- An uncaught exception prints the script's traceback as `python` would
  (without the tool's frames; where the tool turned PyTorch's in-place error
  into `InplaceError`, PyTorch's error), then one line with the diagnosis;
  the report follows.
- A script that does not compile (a `SyntaxError`, a bad encoding) gets
  python's message and exit 1, as under `python`: the error is the file's it
  names, not the tool's that compiled it. What python refuses as it reads a
  script file, where `runpy`'s compile of its bytes would let it through or
  name no file, is refused first with python's words (`refused_by_python`): a
  byte that is not UTF-8 in a file that declares no encoding (in a comment
  too), a null byte.
- A script that fails after the watched window ended gets a last line saying
  so, with the `--steps` that would watch the step it failed in.

Exit codes: the script's own non-zero exit wins (an uncaught exception is 1,
as with `python`; Ctrl-C is 130, as a shell reports it); else 1 when findings at or above `fail-on` were reported;
else 0.
"""

from __future__ import annotations

import codecs
import os
import runpy
import sys
from typing import TYPE_CHECKING, Any, TextIO

from ...api import watch
from ...causes import ForbiddenCause, LeafCause
from ...errors import InplaceError, taken_from_program
from ...printing import user_streams
from ...report import Report
from ...trace.raised.blame import internal_error, raised_by_the_tool
from ..errors import CliUsageError
from .steps import RunStats, StepCounter
from .tracebacks import print_script_error

if TYPE_CHECKING:
    from .script_verify import ModelCalls


def run_script(
    target: str,
    args: list[str],
    *,
    module: bool = False,
    fail_fast: bool = False,
    steps: int | None = None,
    select: list[str] | None = None,
    ignore: list[str] | None = None,
    per_module_ignores: dict[str, list[str]] | None = None,
    err: TextIO | None = None,
    check_contents: bool = False,
    models: ModelCalls | None = None,
    deep: bool | None = None,
) -> tuple[int, Report, RunStats]:
    """Run the script; return (its exit status, the report, what was watched).

    The script's own traceback goes to `err` (stderr) as python prints it; the
    diagnosis of an in-place error is returned in `RunStats.diagnosis`. With `models`, the first
    call of each top-level module in the watched window is recorded there (`run --verify`).
    """
    session = watch(
        fail_fast=fail_fast, select=select, ignore=ignore, per_module_ignores=per_module_ignores,
        check_contents=check_contents, deep=deep,
    )
    stats = RunStats()
    saved_argv = sys.argv[:]
    status = 0
    sys.argv = [target, *args]
    sys.path.insert(0, os.getcwd() if module else os.path.dirname(os.path.abspath(target)))
    counter = StepCounter(session, steps, stats)
    missing: BaseException | None = None
    session.__enter__()
    if models is not None:
        models.observe(session.tracer.modules)
    refused = None if module else refused_by_python(target)
    try:
        with counter:
            try:
                with user_streams():  # after the script, sys.stderr is the tool's again, even if it closed it
                    if refused is not None:
                        raise refused
                    if module:
                        runpy.run_module(target, run_name="__main__", alter_sys=True)
                    else:
                        runpy.run_path(target, run_name="__main__")
            except SystemExit as e:
                status = _exit_status(e.code, err or sys.stderr)
            except InplaceError as e:  # raised inside the script at the write (fail-fast)
                counter.stop()
                status = 1
                print_script_error(e, err or sys.stderr)
                stats.diagnosis = _diagnosis(e)
            except BaseException as exc:
                carried = taken_from_program(exc)  # PyTorch's error in backward, with the tool's diagnosis
                if exc is refused:  # python's own refusal of the file: its words, exit 1, as under python
                    status = 1
                    print_script_error(exc, err or sys.stderr)
                elif carried is not None:
                    session.tracer.left(exc)  # it ended the script: not one the script caught
                    counter.stop()
                    status = 1
                    print_script_error(exc, err or sys.stderr)
                    stats.diagnosis = _diagnosis(carried)
                else:
                    missing, status = _script_raised(exc, session, counter, stats, module, target, err)
    finally:
        try:
            counter.stop()
        except InplaceError as e:  # an in-place error PyTorch raised that the script did not see
            status = status or 1
            stats.diagnosis = _diagnosis(e)
        sys.argv = saved_argv
        sys.path.pop(0)
        if missing is not None:
            raise _no_module_error(target) from None
    stats.failed_after_window = bool(status) and stats.window_ended and stats.diagnosis is None
    stats.threads = session.tracer.threads.note()
    report = session.report()
    counter.name_write_lines(report)  # IPD109's writing lines, found in the watched steps that followed
    return status, report, stats


def refused_by_python(path: str) -> SyntaxError | None:
    """The `SyntaxError` python raises, as it reads the script file at `path`, for what `runpy`
    would run anyway or blame on no file: a byte that is not UTF-8 in a file with no BOM and no
    coding line (python checks every line, comments too), a null byte. None for a file python reads."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None  # runpy says why
    where = os.path.abspath(path)  # python names the script by its absolute path
    lines = data.splitlines()  # at \n, \r and \r\n, as python counts lines
    for number, line in enumerate(lines, 1):
        if b"\0" in line:
            text = line.split(b"\0")[0].decode("utf-8", "replace")
            return SyntaxError("source code cannot contain null bytes", (where, number, None, text))
    if data.startswith(codecs.BOM_UTF8) or _declares_encoding(lines[:2]):
        return None  # python decodes it as declared, and so does runpy's compile
    for number, line in enumerate(lines, 1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as e:
            return SyntaxError(f"Non-UTF-8 code starting with '\\x{line[e.start]:02x}' in file {where} on line "
                               f"{number}, but no encoding declared; see https://peps.python.org/pep-0263/ for details")
    return None


def _declares_encoding(first: list[bytes]) -> bool:
    """Whether the first two lines hold PEP 263's coding line (`# -*- coding: latin-1 -*-`): the
    first line, or the second after a first that is blank or only a comment (as `tokenize` reads)."""
    if not first:
        return False
    if _coding_line(first[0]):
        return True
    opening = first[0].decode("latin-1").lstrip(" \t\f")
    return len(first) > 1 and opening[:1] in ("", "#") and _coding_line(first[1])


def _coding_line(line: bytes) -> bool:
    """A comment with `coding:` or `coding=` followed by a name."""
    text = line.decode("latin-1").lstrip(" \t\f")
    if not text.startswith("#"):
        return False
    at = text.find("coding")
    while at != -1:
        after = text[at + len("coding"):]
        name = after[1:].lstrip(" \t")
        if after[:1] in (":", "=") and name[:1] and (name[0].isalnum() or name[0] in "-_."):
            return True
        at = text.find("coding", at + 1)
    return False


def _script_raised(
    exc: BaseException, session: watch, counter: StepCounter, stats: RunStats, module: bool, target: str,
    err: TextIO | None,
) -> tuple[BaseException | None, int]:
    """The script raised `exc` (not an in-place error the tool diagnosed): print it as python would,
    let the session diagnose it; (the `-m` module that was missing, the exit status)."""
    if module and _module_missing(exc, target):  # -m names no module: a usage error, after cleanup
        return exc, 0
    if raised_by_the_tool(exc):  # the tool's crash inside the script: `main` says so, exit 4
        raise internal_error(exc) from exc
    status = 130 if isinstance(exc, KeyboardInterrupt) else 1  # 130: as a shell reports python's
    if counter.active:  # raised inside backward: a note names the forward line of the failing node
        session.annotate(exc)
    print_script_error(exc, err or sys.stderr)
    if counter.active:  # let the session turn a PyTorch in-place error into the diagnosis
        counter.active = False
        try:
            session.__exit__(type(exc), exc, exc.__traceback__)
        except InplaceError as e:
            stats.diagnosis = _diagnosis(e)
    return None, status


def _module_missing(exc: BaseException, target: str) -> bool:
    """Whether `runpy` itself found no module `target` (or no package above it), as opposed to an
    ImportError raised by the code of a module that exists."""
    if not isinstance(exc, ImportError) or exc.__traceback__ is None:
        return False
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    if tb.tb_frame.f_globals.get("__name__") != "runpy":  # raised in the module's own code
        return False
    cause = exc.__cause__
    if cause is None:
        return str(exc) == f"No module named {target}"
    name = getattr(cause, "name", None)
    return isinstance(cause, ModuleNotFoundError) and bool(name) and (target == name or target.startswith(f"{name}."))


def _no_module_error(target: str) -> CliUsageError:
    from ..model import _closest_module

    close = _closest_module(target)
    hint = f"did you mean {close!r}?" if close else "give an importable module (from the folder that holds it), or a path to a .py file"
    return CliUsageError(f"no module named {target!r} for -m; {hint}")


def _diagnosis(error: InplaceError) -> str:
    """One line naming what happened; the report that follows names the culprits in full."""
    if error.findings:
        f = error.findings[0]
        op, where = f.mutation.op.removeprefix("aten."), f.mutation.location
        if isinstance(f.cause, (LeafCause, ForbiddenCause)):  # PyTorch refused the op: nothing was written
            return (
                f"the script stopped where PyTorch refused the in-place `{op}` at {where} ({f.code}); "
                "the report below says why and the fix"
            )
        if f.saved is None:
            return f"the script stopped at an in-place error ({f.code}): `{op}` at {where}; the report below names the fix"
        return (
            f"the script stopped at an in-place error ({f.code}): `{op}` at {where} overwrote a tensor saved at "
            f"{f.saved.location}; the report below names both lines and the fix"
        )
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    return f"the script stopped at an in-place error: {first}"


def _exit_status(code: Any, err: TextIO) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=err)  # `sys.exit("message")`, as python prints it
    return 1
