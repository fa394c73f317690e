"""Hugging Face `Trainer`: `InplaceDoctorCallback` watches the first N training steps of `train()`.

    from transformers import Trainer
    from inplace_doctor.integrations.transformers import InplaceDoctorCallback

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[InplaceDoctorCallback(steps=1)])
    trainer.train()   # InplaceHazardsFound (or ipd.InplaceError) on an in-place bug

Where the window lies (transformers 5.x, `Trainer._inner_training_loop`): `on_step_begin`
runs before the first micro-batch of a step, after the batches were fetched; then each
micro-batch's `training_step` (forward in `compute_loss`, backward through
`accelerator.backward`), gradient clipping, `optimizer.step()`, the scheduler and
`model.zero_grad()`, then `on_step_end`. The window opens in the first `on_step_begin` and
closes in the `on_step_end` where `state.global_step` has advanced by N, so it holds every
watched step's forward, backward, optimizer step and `zero_grad`, with gradient accumulation
too (one step is `gradient_accumulation_steps` micro-batches). Evaluation and saving run after
`on_step_end`, outside; a run that ends sooner closes it in `on_train_end`.

`Trainer.train` tells callbacks nothing when it raises, so while watching, the `Trainer`'s
`training_step` and its optimizer's `step` are wrapped on the instance (the `Trainer` is the
caller of the callback handler, found on the stack in `on_train_begin`): an exception inside
them closes the window first, and an in-place error PyTorch raises at backward leaves `train()`
as `ipd.InplaceError` naming the write and the save, with no tracer left installed. For an error
anywhere else while the window is open (the data collator fetching a later step's batches,
gradient clipping, the scheduler, another callback), `train` itself is wrapped on the `Trainer`
instance, once, in `on_init_end`: the exception closes the window on its way out, the report is
published, and `train()` raises that exception unchanged (an in-place autograd error still becomes
`ipd.InplaceError`, chained, as in the guarded calls). `on_init_end` runs only for callbacks
given to `Trainer(callbacks=[...])`; one added later with `trainer.add_callback` is closed by the
next `on_train_begin` of this callback, or by `callback.close()` after catching the error.

When the window closes the main process prints one line, `inplace-doctor watched N training
step(s) of ...: no finding` on a clean run, followed by the text report when something was
found (the line the Lightning callback prints too). It goes to stdout through `tqdm.write`, as
the `Trainer`'s own `{'train_runtime': ...}` line does, so a progress bar stays intact. The
counts go to `state.log_history` (`inplace_doctor/findings` and counts by severity). Importing this module imports transformers
(`pip install inplace-doctor[transformers]`, which brings `accelerate`, which `Trainer` needs).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from tqdm.auto import tqdm
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from .._compat import frame_locals
from ..api import Report, Severity
from ..trace.raised.blame import call_through
from .window import Selection, StepWindow

__all__ = ["InplaceDoctorCallback"]


class InplaceDoctorCallback(TrainerCallback):
    """Watch the first `steps` training steps (forward, backward, optimizer step) under `ipd.watch()`.

    After the window: one summary line is printed (with the text report below it when something
    was found), the counts appended to `state.log_history`, the `Report` kept in `callback.report`; a finding at or above `fail_on` stops `train()` with
    `InplaceHazardsFound` (its message is the report). `fail_on=None` only reports. The watch
    changes no value: weights after training are bit-identical with and without the callback.
    Given to `Trainer(callbacks=[...])`, it wraps that `Trainer`'s `train` so that any error
    leaving `train()` closes the window first (the error itself is raised unchanged).

    Args:
        steps: optimizer steps to watch (`state.global_step`), from the first.
        fail_on: "error" (default), "warning", "info", or None.
        select, ignore: rule codes or prefixes, as for `ipd.watch`.
        stack: frames the text report shows per site.
        deep: as `watch`'s: `deep=False` with `select` of the fast tracer's rules (IPD101, IPD104,
            IPD106) runs the fast tracer over the window; its kernels are registered once, when the
            window opens, and removed when it closes.

    Example:
        >>> trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[InplaceDoctorCallback()])
    """

    def __init__(
        self,
        steps: int = 1,
        fail_on: str | Severity | None = "error",
        *,
        select: Selection = None,
        ignore: Selection = None,
        stack: int = 2,
        deep: bool | None = None,
    ) -> None:
        self._settings = (steps, fail_on, select, ignore, stack, deep)
        self._window = StepWindow(*self._settings)
        self._trainer: Trainer | None = None
        self._first_step = 0

    @property
    def report(self) -> Report | None:
        """The findings of the watched window (None until it closed)."""
        return self._window.report

    def close(self) -> Report | None:
        """Stop watching now (after catching an error of `train()`, for a callback added with
        `add_callback`: only one given to `Trainer(callbacks=...)` closes on any error itself)."""
        return self._window.close()

    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        trainer = _calling_trainer()
        if trainer is not None:
            trainer.train = self._closing_on_error(trainer.train)  # type: ignore[method-assign]

    def _closing_on_error(self, train: Callable[..., Any]) -> Callable[..., Any]:
        """`train`, closing the window (if open) with any exception it raises, which it then re-raises:
        the only place that sees an error outside the guarded calls before it leaves the fit."""
        callback = self

        @functools.wraps(train)
        def train_closing_the_window(*args: Any, **kwargs: Any) -> Any:
            try:
                return call_through(train, args, kwargs)  # the fit's errors are its own
            except BaseException as exc:  # KeyboardInterrupt too: no tracer outlives the fit
                callback._window.abandon(exc)
                raise

        return train_closing_the_window

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._window.close()  # a window a failed train() left open
        self._window = StepWindow(*self._settings)  # each train() watches its own first steps
        self._trainer = _calling_trainer()

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self._window.started:
            return
        self._first_step = state.global_step
        trainer = self._trainer
        if trainer is not None:
            self._window.guard(trainer, ("training_step",))
            self._window.guard(trainer.optimizer, ("step",))
        self._window.on_error_close = functools.partial(self._publish, state)
        model = kwargs.get("model")
        self._window.open(model, f"Trainer.train of {type(model).__name__}")

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self._window.is_open and state.global_step - self._first_step >= self._window.steps:
            self._finish(state)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self._window.is_open:  # the run had fewer steps than `steps`
            self._finish(state)

    def _finish(self, state: TrainerState) -> None:
        self._window.close()
        self._window.verdict(self._publish(state))

    def _publish(self, state: TrainerState) -> int:
        """Print the summary (main process only) and add the counts to `state.log_history`; the steps watched."""
        watched = state.global_step - self._first_step
        if self._window.report is None:
            return watched
        if state.is_world_process_zero:
            tqdm.write(self._window.announcement(watched))
        state.log_history.append({**self._window.metrics(), "step": state.global_step})
        return watched


def _calling_trainer() -> Trainer | None:
    """The `Trainer` whose loop called this hook (the `self` of a frame up the stack), if any."""
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame_locals(frame).get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back  # type: ignore[assignment]
    return None
