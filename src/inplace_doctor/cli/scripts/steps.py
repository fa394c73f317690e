"""Counting training steps for `inplace-doctor run --steps N`, and stopping the watch after N.

What counts as a step (optimizer steps once one is seen, backward passes before
that and in scripts without one) is spelled out in `script.py`'s docstring.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from ...api import watch
from ...engines.distributed import current_rank
from ...engines.replay_writes import StepLineSearches
from ...report import Report
from ...trace.raised.blame import call_through


@dataclass
class Tally:
    """Steps of one kind (backward passes or optimizer steps), watched and after the window."""

    watched: int = 0
    first_s: float = 0.0  # to the end of the first watched one (start-up and warm-up included)
    last_s: float = 0.0  # to the end of the last watched one
    after: int = 0
    after_first_s: float = 0.0  # from the end of the window to the end of the first unwatched one
    after_s: float = 0.0  # from the end of the window to the end of the last unwatched one

    def watched_one(self, elapsed: float) -> None:
        self.watched += 1
        self.last_s = elapsed
        if self.watched == 1:
            self.first_s = elapsed

    def unwatched_one(self, elapsed: float) -> None:
        self.after += 1
        self.after_s = elapsed
        if self.after == 1:
            self.after_first_s = elapsed

    def unwatched_text(self) -> str:
        """The steps after the window, timed warm: the first of them (which compiles what
        `torch.compile` left to run, and warms caches up) is left out of the figure."""
        first, last = self.watched + 1, self.watched + self.after
        if self.after == 1:
            return f"then 1 unwatched (step {first}), too few for a figure without its warm-up"
        per = (self.after_s - self.after_first_s) / (self.after - 1)
        over = f"step {last}" if self.after == 2 else f"steps {first + 1}-{last}"
        return (
            f"then {self.after} unwatched, {per * 1e3:.1f} ms per step over {over}, "
            f"the first (step {first}) left out as warm-up"
        )


@dataclass
class RunStats:
    backward: Tally = field(default_factory=Tally)
    optimizer: Tally = field(default_factory=Tally)
    window_ended: bool = False  # --steps N was reached and watching stopped
    failed_after_window: bool = False  # the script failed after that, undiagnosed
    diagnosis: str | None = None  # the one line for an in-place error the script stopped at
    threads: str | None = None  # the note on threads the script started, which ran unwatched
    #: the process's rank while it trained (a script destroys its process group before the report is made)
    rank: int | None = None
    #: frames `torch.compile` had compiled when the window ended (None: dynamo not imported by then)
    compiled_frames_at_window_end: int | None = None

    def compiled_after_window(self) -> bool:
        """Whether compiled code ran after the window: `torch.compile` compiled a frame since it
        ended (while watched, compiled code ran eagerly and compiled nothing)."""
        if not self.window_ended:
            return False
        now = compiled_frames()
        return now is not None and now > (self.compiled_frames_at_window_end or 0)

    @property
    def steps(self) -> Tally:
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
            text += "; " + tally.unwatched_text()
        if self.failed_after_window:
            return (
                f"{text}; the script failed after the watched window (--steps {steps_limit}): "
                f"run with --steps {tally.watched + tally.after + 1} to watch the failing step"
            )
        return f"{text} (--steps {steps_limit})"


class StepCounter:
    """Counts training steps and stops the session after N of them (the rule: script.py's docstring).

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
        #: IPD109 changes a step found without their line, looked for in the watched steps after it
        self.write_lines = StepLineSearches(session.tracer.contents, lambda: stats.steps.watched + 1)

    def __enter__(self) -> StepCounter:
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
        self.write_lines.end_search()  # the script's frames are done: no trace function outlives them
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
                result = call_through(original, args, kwargs)  # the script's backward: its errors are its own
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
        if stats.rank is None and self.active:
            stats.rank = current_rank()
        if self._in_step:
            pass  # part of the optimizer step (a closure's backward)
        elif self.active and not self._pending_stop:
            if not stats.optimizer.watched:
                stats.backward.watched_one(self._elapsed())
                if self.limit is not None and stats.backward.watched >= self.limit:
                    self._stop_at_next_backward = True
                self.write_lines.step_ended(stats.backward.watched, not self._stop_at_next_backward)
            else:  # this step ends at its optimizer step: is it the last one watched?
                step = stats.optimizer.watched + 1
                self.write_lines.step_ended(step, self.limit is None or step < self.limit)
        elif not self.active:
            stats.backward.unwatched_one(self._elapsed())
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
            last = self.limit is not None and stats.optimizer.watched >= self.limit
            self.write_lines.step_ended(stats.optimizer.watched, not last)
            if last:
                self._request_stop()
        elif not self.active:
            stats.optimizer.unwatched_one(self._elapsed())
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
            self.stats.compiled_frames_at_window_end = compiled_frames()
            self.start = time.perf_counter()

    def stop(self) -> None:
        if self.active:
            self.active = False
            self.write_lines.end_search()
            self.session.__exit__(None, None, None)

    def name_write_lines(self, report: Report) -> None:
        """Put into `report` what the later steps found of the lines that wrote saved tensors outside PyTorch."""
        self.write_lines.amend(report)


def compiled_frames() -> int | None:
    """Frames `torch.compile` has compiled in this process (dynamo's own count), or None when the
    script never imported dynamo (nothing was compiled) or this torch keeps no such count."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    try:
        return int(counters["frames"]["total"]) if counters is not None else None
    except (KeyError, TypeError, ValueError):
        return None
