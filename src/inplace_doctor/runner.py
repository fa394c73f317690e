"""`inplace-doctor run`: a user's script (or `-m module`) run as `python` would, under watch().

- The script sees the arguments after its path, unchanged, in `sys.argv`;
  `sys.path[0]` is its folder (for `-m`, the working directory), and it runs
  as `__main__`.
- The report goes to stderr (or `--output`), so the script's own stdout is intact.
- `--steps N` instruments the first N backward passes (`torch.autograd.backward`
  and `torch.autograd.grad` calls) and then stops watching: the rest of the
  script runs at full speed.
- An in-place error the script does not catch prints the diagnosis with
  both culprits instead of PyTorch's bare error.

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
from dataclasses import dataclass
from typing import Any, Callable, TextIO

import torch

from .api import watch
from .errors import InplaceError
from .report import Report


@dataclass
class RunStats:
    steps_watched: int = 0
    steps_after: int = 0
    watched_s: float = 0.0  # from the start to the end of the last watched backward
    after_s: float = 0.0  # from then to the end of the last backward

    first_s: float = 0.0  # to the end of the first watched backward (start-up and warm-up included)

    def summary(self, steps_limit: int | None) -> str:
        if not self.steps_watched:
            return "no backward pass ran"
        if self.steps_watched > 1:
            per = (self.watched_s - self.first_s) / (self.steps_watched - 1)
            text = f"watched {self.steps_watched} backward passes, {per * 1e3:.1f} ms per step after the first"
        else:
            text = f"watched 1 backward pass ({self.watched_s:.2f} s from the start, imports included)"
        if steps_limit is not None and self.steps_after:
            text += (
                f"; then {self.steps_after} unwatched, {self.after_s / self.steps_after * 1e3:.1f} ms per step "
                f"(--steps {steps_limit})"
            )
        return text


class _BackwardCounter:
    """Counts backward passes and stops the session after N of them.

    Wraps `Tensor.backward`, `torch.autograd.backward` and `torch.autograd.grad`;
    only the outermost call counts (`Tensor.backward` calls the others). The
    session stops only outside PyTorch's torch-function handling: inside it our
    function mode is off the stack and could not be popped.
    """

    _TARGETS = ((torch.Tensor, "backward"), (torch.autograd, "backward"), (torch.autograd, "grad"))

    def __init__(self, session: watch, limit: int | None, stats: RunStats) -> None:
        self.session = session
        self.limit = limit
        self.stats = stats
        self.active = True
        self.start = time.perf_counter()
        self._depth = 0
        self._pending_stop = False
        self._stack_len = 0
        self._originals: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> "_BackwardCounter":
        self._stack_len = torch._C._len_torch_function_stack()
        for owner, name in self._TARGETS:
            original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
            self._originals.append((owner, name, original))
            setattr(owner, name, self._wrap(original))
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._originals):
            setattr(owner, name, original)
        self._originals = []

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        counter = self

        @functools.wraps(original)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
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

    def _after_backward(self) -> None:
        now = time.perf_counter()
        stats = self.stats
        if self.active and not self._pending_stop:
            stats.steps_watched += 1
            stats.watched_s = now - self.start
            if stats.steps_watched == 1:
                stats.first_s = stats.watched_s
            if self.limit is not None and stats.steps_watched >= self.limit:
                self._pending_stop = True
        elif not self.active:
            stats.steps_after += 1
            stats.after_s = now - self.start
        if self._pending_stop:
            self._maybe_stop()

    def _maybe_stop(self) -> None:
        if torch._C._len_torch_function_stack() >= self._stack_len:
            self._pending_stop = False
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
    """Run the script; return (its exit status, the report, timing)."""
    err = err or sys.stderr
    session = watch(fail_fast=fail_fast, select=select, ignore=ignore, per_module_ignores=per_module_ignores)
    stats = RunStats()
    saved_argv = sys.argv[:]
    status = 0
    sys.argv = [target, *args]
    sys.path.insert(0, os.getcwd() if module else os.path.dirname(os.path.abspath(target)))
    counter = _BackwardCounter(session, steps, stats)
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
            except InplaceError as e:
                counter.stop()
                status = 1
                _diagnosis(e, err)
            except BaseException as exc:
                status = 1
                if counter.active:  # let the session turn a PyTorch in-place error into the diagnosis
                    counter.active = False
                    try:
                        session.__exit__(type(exc), exc, exc.__traceback__)
                    except InplaceError as e:
                        _diagnosis(e, err)
                    else:
                        traceback.print_exc(file=err)
                else:
                    traceback.print_exc(file=err)
    finally:
        try:
            counter.stop()
        except InplaceError as e:  # an in-place error PyTorch raised that the script did not see
            status = status or 1
            _diagnosis(e, err)
        sys.argv = saved_argv
        sys.path.pop(0)
    return status, session.report(), stats


def _diagnosis(error: InplaceError, err: TextIO) -> None:
    """One line; the report that follows names both culprits."""
    first = str(error.__cause__ or error).splitlines()[0]
    print(f"inplace-doctor: the script stopped at an in-place error: {first}", file=err)


def _exit_status(code: Any, err: TextIO) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=err)  # `sys.exit("message")`, as python prints it
    return 1
