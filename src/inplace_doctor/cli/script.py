"""`inplace-doctor run`: a user's script (or `-m module`) run as `python` would, under watch().

- The script sees the arguments after its path, unchanged, in `sys.argv`;
  `sys.path[0]` is its folder (for `-m`, the working directory), and it runs
  as `__main__`.
- The report goes to stderr, so the script's own stdout is intact; with
  `--output FILE` it goes to FILE only, and the tool prints nothing.
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
- A script that fails after the watched window ended gets a last line saying
  so, with the `--steps` that would watch the step it failed in.

Exit codes: the script's own non-zero exit wins (an uncaught exception is 1,
as with `python`); else 1 when findings at or above `fail-on` were reported;
else 0.
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from ..engines.audit import watch
from ..errors import InplaceError
from ..report import Report

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_EXAMPLES_DIR = os.path.join(_PACKAGE_DIR, "examples")


@dataclass
class _Tally:
    """Steps of one kind (backward passes or optimizer steps), watched and after the window."""

    watched: int = 0
    first_s: float = 0.0  # to the end of the first watched one (start-up and warm-up included)
    last_s: float = 0.0  # to the end of the last watched one
    after: int = 0
    after_s: float = 0.0  # from the end of the window to the end of the last unwatched one

    def watched_one(self, elapsed: float) -> None:
        self.watched += 1
        self.last_s = elapsed
        if self.watched == 1:
            self.first_s = elapsed


@dataclass
class RunStats:
    backward: _Tally = field(default_factory=_Tally)
    optimizer: _Tally = field(default_factory=_Tally)
    window_ended: bool = False  # --steps N was reached and watching stopped
    failed_after_window: bool = False  # the script failed after that, undiagnosed
    diagnosis: str | None = None  # the one line for an in-place error the script stopped at

    @property
    def steps(self) -> _Tally:
        """The tally that counts as steps: optimizer steps once one was watched, else backward passes."""
        return self.optimizer if self.optimizer.watched else self.backward

    def summary(self, steps_limit: int | None) -> str:
        """What was watched, at what cost per step, and what ran after the window."""
        tally = self.steps
        one, many = ("optimizer step", "optimizer steps") if tally is self.optimizer else ("backward pass", "backward passes")
        if not tally.watched:
            text = "no backward pass completed"
        elif tally.watched > 1:
            per = (tally.last_s - tally.first_s) / (tally.watched - 1)
            text = f"watched {tally.watched} {many}, {per * 1e3:.1f} ms per step after the first"
        else:
            text = f"watched 1 {one} ({tally.last_s:.2f} s from the start, imports included)"
        if steps_limit is None or not self.window_ended:
            return text
        if tally.after:
            text += f"; then {tally.after} unwatched, {tally.after_s / tally.after * 1e3:.1f} ms per step"
        if self.failed_after_window:
            return (
                f"{text}; the script failed after the watched window (--steps {steps_limit}): "
                f"run with --steps {tally.watched + tally.after + 1} to watch the failing step"
            )
        return f"{text} (--steps {steps_limit})"


class _StepCounter:
    """Counts training steps and stops the session after N of them (the rule: module docstring).

    Wraps `Tensor.backward`, `torch.autograd.backward` and `torch.autograd.grad`
    (only the outermost call counts: `Tensor.backward` calls the others) and
    registers global optimizer step pre/post hooks. The session stops only
    outside PyTorch's torch-function handling: inside it our function mode is
    off the stack and could not be popped.
    """

    _TARGETS = ((torch.Tensor, "backward"), (torch.autograd, "backward"), (torch.autograd, "grad"))

    def __init__(self, session: watch, limit: int | None, stats: RunStats) -> None:
        self.session = session
        self.limit = limit
        self.stats = stats
        self.active = True
        self.start = time.perf_counter()
        self._depth = 0
        self._in_step = 0
        self._pending_stop = False
        self._stop_at_next_backward = False  # N backward passes, no optimizer step yet
        self._stack_len = 0
        self._originals: list[tuple[Any, str, Any]] = []
        self._hooks: list[Any] = []

    def __enter__(self) -> "_StepCounter":
        self._stack_len = torch._C._len_torch_function_stack()
        for owner, name in self._TARGETS:
            original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
            self._originals.append((owner, name, original))
            setattr(owner, name, self._wrap(original))
        self._hooks = [
            register_optimizer_step_pre_hook(self._before_optimizer_step),
            register_optimizer_step_post_hook(self._after_optimizer_step),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        for owner, name, original in reversed(self._originals):
            setattr(owner, name, original)
        self._originals = []

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        counter = self

        @functools.wraps(original)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if counter._depth == 0 and counter._stop_at_next_backward and not counter._in_step:
                counter._stop_at_next_backward = False
                counter._request_stop()
            counter._depth += 1
            try:
                result = original(*args, **kwargs)
            finally:
                counter._depth -= 1
            if counter._depth == 0:
                counter._after_backward()
            elif counter._pending_stop:
                counter._maybe_stop()
            return result

        return wrapped

    def _elapsed(self) -> float:
        return time.perf_counter() - self.start

    def _after_backward(self) -> None:
        stats = self.stats
        if self._in_step:
            pass  # part of the optimizer step (a closure's backward)
        elif self.active and not self._pending_stop:
            if not stats.optimizer.watched:
                stats.backward.watched_one(self._elapsed())
                if self.limit is not None and stats.backward.watched >= self.limit:
                    self._stop_at_next_backward = True
        elif not self.active:
            stats.backward.after += 1
            stats.backward.after_s = self._elapsed()
        if self._pending_stop:
            self._maybe_stop()

    def _before_optimizer_step(self, *hook_args: Any) -> None:
        self._in_step += 1

    def _after_optimizer_step(self, *hook_args: Any) -> None:
        self._in_step = max(self._in_step - 1, 0)
        if self._in_step:
            return  # an optimizer stepping another inside its own step
        stats = self.stats
        if self.active and not self._pending_stop:
            self._stop_at_next_backward = False
            stats.optimizer.watched_one(self._elapsed())
            if self.limit is not None and stats.optimizer.watched >= self.limit:
                self._request_stop()
        elif not self.active:
            stats.optimizer.after += 1
            stats.optimizer.after_s = self._elapsed()
        if self._pending_stop:
            self._maybe_stop()

    def _request_stop(self) -> None:
        self._pending_stop = True
        self._maybe_stop()

    def _maybe_stop(self) -> None:
        if torch._C._len_torch_function_stack() >= self._stack_len:
            self._pending_stop = False
            self.stats.window_ended = True
            self.stop()
            self.start = time.perf_counter()

    def stop(self) -> None:
        if self.active:
            self.active = False
            self.session.__exit__(None, None, None)


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
) -> tuple[int, Report, RunStats]:
    """Run the script; return (its exit status, the report, what was watched).

    The script's own traceback goes to `err` (stderr) as python prints it; the
    diagnosis of an in-place error is returned in `RunStats.diagnosis`.
    """
    err = err or sys.stderr
    session = watch(fail_fast=fail_fast, select=select, ignore=ignore, per_module_ignores=per_module_ignores)
    stats = RunStats()
    saved_argv = sys.argv[:]
    status = 0
    sys.argv = [target, *args]
    sys.path.insert(0, os.getcwd() if module else os.path.dirname(os.path.abspath(target)))
    counter = _StepCounter(session, steps, stats)
    session.__enter__()
    try:
        with counter:
            try:
                if module:
                    runpy.run_module(target, run_name="__main__", alter_sys=True)
                else:
                    runpy.run_path(target, run_name="__main__")
            except SystemExit as e:
                status = _exit_status(e.code, err)
            except InplaceError as e:  # raised inside the script: at the write (fail-fast) or in backward
                counter.stop()
                status = 1
                print_script_error(e, err)
                stats.diagnosis = _diagnosis(e)
            except BaseException as exc:
                status = 1
                print_script_error(exc, err)
                if counter.active:  # let the session turn a PyTorch in-place error into the diagnosis
                    counter.active = False
                    try:
                        session.__exit__(type(exc), exc, exc.__traceback__)
                    except InplaceError as e:
                        stats.diagnosis = _diagnosis(e)
    finally:
        try:
            counter.stop()
        except InplaceError as e:  # an in-place error PyTorch raised that the script did not see
            status = status or 1
            stats.diagnosis = _diagnosis(e)
        sys.argv = saved_argv
        sys.path.pop(0)
    stats.failed_after_window = bool(status) and stats.window_ended and stats.diagnosis is None
    return status, session.report(), stats


def _diagnosis(error: InplaceError) -> str:
    """One line naming what happened; the report that follows names both culprits in full."""
    if error.findings:
        f = error.findings[0]
        saved = f" saved at {f.saved.location}" if f.saved is not None else ""
        return (
            f"the script stopped at an in-place error ({f.code}): `{f.mutation.op.removeprefix('aten.')}` at "
            f"{f.mutation.location} overwrote a tensor{saved}; the report below names both lines and the fix"
        )
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    return f"the script stopped at an in-place error: {first}"


def print_script_error(exc: BaseException, err: TextIO) -> None:
    """Print the traceback python would have printed for `exc`, without the tool.

    The tool's frames (this runner, runpy, the tracer's hooks and modes) are
    left out, and so are exceptions the tool chained on; where the tool
    replaced PyTorch's error with `InplaceError`, PyTorch's error is shown.
    """
    shown, frames_of = exc, exc
    if isinstance(exc, InplaceError) and isinstance(exc.__cause__, BaseException):
        shown = exc.__cause__
        frames_of = shown if shown.__traceback__ is not None else exc
    report = traceback.TracebackException(type(shown), shown, frames_of.__traceback__, compact=True)
    _trim(report)
    err.flush()
    print("".join(report.format()), end="", file=err)
    err.flush()


def _trim(report: traceback.TracebackException) -> None:
    seen: set[int] = set()
    pending: list[traceback.TracebackException] = [report]
    while pending:
        te = pending.pop()
        if id(te) in seen:
            continue
        seen.add(id(te))
        te.stack = traceback.StackSummary.from_list(_user_frames(list(te.stack)))
        for attr in ("__cause__", "__context__"):
            chained = getattr(te, attr)
            if chained is None:
                continue
            if _is_tool_exception(chained):
                setattr(te, attr, None)
            else:
                pending.append(chained)


def _is_tool_exception(te: traceback.TracebackException) -> bool:
    """The tool's own exceptions, except `WrittenHere`: where the write ran is the diagnosis, kept."""
    module = getattr(te, "exc_type_module", None)
    name = getattr(te, "exc_type_qualname", None)
    if module is None:  # Python < 3.13
        exc_type = getattr(te, "exc_type", None)
        module = getattr(exc_type, "__module__", "")
        name = getattr(exc_type, "__qualname__", "")
    return str(module).startswith("inplace_doctor.") and name != "WrittenHere"


def _is_tool_frame(frame: traceback.FrameSummary) -> bool:
    filename = os.path.abspath(frame.filename) if not frame.filename.startswith("<") else frame.filename
    if filename in ("<frozen runpy>",) or os.path.basename(filename) == "runpy.py":
        return True
    return filename.startswith(_PACKAGE_DIR + os.sep) and not filename.startswith(_EXAMPLES_DIR + os.sep)


# PyTorch's frames that call into the tool's modes and hooks; python without the tool shows none of them.
_DISPATCH_FILES = tuple(
    os.path.join("torch", *parts) for parts in (("overrides.py",), ("_dynamo", "eval_frame.py"), ("utils", "_python_dispatch.py"))
)


def _user_frames(frames: list[traceback.FrameSummary]) -> list[traceback.FrameSummary]:
    """The frames python would have shown: without the tool's, nor PyTorch's calls into the tool's
    modes (`handle_torch_function` dispatching to our function mode, dynamo's `disable` wrapper,
    `_ops.py` called by our dispatch mode)."""
    keep = [not _is_tool_frame(f) for f in frames]
    for i in range(len(frames)):
        if keep[i]:
            continue
        j = i - 1
        while j >= 0 and keep[j] and frames[j].filename.endswith(_DISPATCH_FILES):
            keep[j] = False
            j -= 1
        if j < i - 1 and j >= 0 and keep[j] and "handle_torch_function" in (frames[j].line or ""):
            keep[j] = False  # the torch function that dispatched only because our mode is on
        j = i + 1
        while j < len(frames) and frames[j].filename.endswith(os.path.join("torch", "_ops.py")):
            keep[j] = False  # the op our dispatch mode ran for the script's own call
            j += 1
    return [f for f, k in zip(frames, keep) if k]


def _exit_status(code: Any, err: TextIO) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=err)  # `sys.exit("message")`, as python prints it
    return 1
