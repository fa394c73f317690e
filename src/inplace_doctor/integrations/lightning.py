"""Lightning: `InplaceDoctorCallback` watches the first N training steps of `Trainer.fit`.

    import lightning.pytorch as pl
    from inplace_doctor.integrations.lightning import InplaceDoctorCallback

    trainer = pl.Trainer(max_steps=100, callbacks=[InplaceDoctorCallback(steps=1)])
    trainer.fit(module, loader)   # InplaceHazardsFound (or ipd.InplaceError) on an in-place bug

Where the window lies (lightning 2.x, `loops/training_epoch_loop.py`): it opens in the first
`on_train_batch_start`, before the batch's `automatic_optimization.run` or
`manual_optimization.run`, which hold the forward (`training_step`), the backward, the
`zero_grad` and the optimizer step (in automatic optimization the forward and backward run in
the closure `optimizer.step(closure)` calls; in manual optimization wherever the module calls
`manual_backward` and `opt.step()`). It closes in the first `on_train_batch_end` where
`trainer.global_step` (optimizer steps) has advanced by N, so with `accumulate_grad_batches=k`
one watched step is k batches and ends after the optimizer stepped. Validation runs after
`on_train_batch_end` and is not watched; a fit that ends sooner closes it in `on_train_end`.

While watching, the strategy's `training_step`, `backward` and `optimizer_step` (what both
optimization modes call) are wrapped on the instance: an exception inside them closes the
window first, so an in-place error PyTorch raises at backward leaves `fit` as `ipd.InplaceError`
naming the write and the save. Lightning re-raises the original exception after
`on_exception`, which cannot replace it; `on_exception` still closes a window left open by an
error elsewhere, so no tracer outlives the fit.

Importing this module imports Lightning (`pip install inplace-doctor[lightning]`).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info

from ..api import Report, Severity
from .window import Selection, StepWindow

__all__ = ["InplaceDoctorCallback"]

_STRATEGY_STEP = ("training_step", "backward", "optimizer_step")


class InplaceDoctorCallback(pl.Callback):
    """Watch the first `steps` training steps (forward, backward, optimizer step) under `ipd.watch()`.

    After the window: counts go to every logger (`inplace_doctor/findings`,
    `inplace_doctor/errors`, ...), the text report to `rank_zero_info`, the `Report` to
    `callback.report`; a finding at or above `fail_on` stops the fit with `InplaceHazardsFound`
    (its message is the report). `fail_on=None` only reports. The watch changes no value:
    weights after the fit are bit-identical with and without the callback.

    Args:
        steps: optimizer steps to watch (Lightning's `global_step`), from the first batch.
        fail_on: "error" (default), "warning", "info", or None.
        select, ignore: rule codes or prefixes, as for `ipd.watch`.
        stack: frames the text report shows per site.
        deep: as `watch`'s: `deep=False` with `select` of the fast tracer's rules (IPD101, IPD104,
            IPD106) runs the fast tracer over the window; its kernels are registered once, when the
            window opens, and removed when it closes.

    Example:
        >>> trainer = pl.Trainer(max_steps=10, callbacks=[InplaceDoctorCallback(steps=2)])
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
        super().__init__()
        self._window = StepWindow(steps, fail_on, select, ignore, stack, deep)
        self._first_step = 0
        self._watched = 0
        self._published = False

    @property
    def report(self) -> Report | None:
        """The findings of the watched window (None until it closed)."""
        return self._window.report

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        if self._window.started:
            return
        self._first_step = trainer.global_step
        self._window.guard(trainer.strategy, _STRATEGY_STEP)
        self._window.open(pl_module, f"Lightning fit of {type(pl_module).__name__}")

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._window.is_open and trainer.global_step - self._first_step >= self._window.steps:
            self._finish(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._window.is_open:  # the fit had fewer steps than `steps`
            self._finish(trainer)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self._window.is_open:  # an error outside the guarded calls: stop watching all the same
            try:
                self._window.close(exception)
            except Exception:  # noqa: BLE001 - Lightning re-raises `exception` itself; the report is kept
                pass
        if not self._published:  # the guard closed it: the InplaceError it raised is what fit raises
            self._publish(trainer)

    def _finish(self, trainer: pl.Trainer) -> None:
        self._window.close()
        self._publish(trainer)
        self._window.verdict(self._watched)

    def _publish(self, trainer: pl.Trainer) -> None:
        self._watched = trainer.global_step - self._first_step
        report = self._window.report
        if report is None:
            return
        self._published = True
        for logger in trainer.loggers:
            logger.log_metrics(self._window.metrics(), step=trainer.global_step)
        rank_zero_info(self._window.announcement(self._watched))
