"""InplaceDoctorCallback in a real `lightning.pytorch.Trainer.fit` (CPU, a tiny module, a few steps)."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import marker_line
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

pl = pytest.importorskip("lightning.pytorch")  # CI installs it through '.[test]'; a guard for bare checkouts

import inplace_doctor as ipd  # noqa: E402
from inplace_doctor.findings import FixKind  # noqa: E402
from inplace_doctor.integrations import InplaceHazardsFound  # noqa: E402
from inplace_doctor.integrations.lightning import InplaceDoctorCallback  # noqa: E402


class Net(nn.Module):
    def __init__(self, broken: bool, clamps_input: bool = False) -> None:
        super().__init__()
        self.hidden = nn.Linear(4, 8)
        self.head = nn.Linear(8, 1)
        self.broken = broken
        self.clamps_input = clamps_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.clamps_input:
            x.clamp_(-3, 3)  # the caller's batch, changed in place: a warning, no error  # <clamp>
        h = torch.sigmoid(self.hidden(x))  # <save>
        if self.broken:
            h.mul_(2)  # <write>
        return self.head(h)


class Regressor(pl.LightningModule):
    def __init__(self, broken: bool = False, manual: bool = False, clamps_input: bool = False) -> None:
        super().__init__()
        self.net = Net(broken, clamps_input)
        self.automatic_optimization = not manual

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor | None:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        if self.automatic_optimization:
            return loss
        opt = self.optimizers()
        opt.zero_grad()  # type: ignore[union-attr]
        self.manual_backward(loss)
        opt.step()  # type: ignore[union-attr]
        return None

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class StepBeforeBackward(Regressor):
    """Manual optimization that steps before the backward of a retained graph: the optimizer's
    in-place update of `net.head.weight` breaks the second backward."""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        opt = self.optimizers()
        self.manual_backward(loss, retain_graph=True)
        opt.step()  # type: ignore[union-attr]
        self.manual_backward(loss)  # <second-backward>


def loader() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 4, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def fit(module: pl.LightningModule, callbacks: list[pl.Callback], **kwargs: object) -> pl.Trainer:
    settings: dict[str, object] = dict(
        accelerator="cpu", devices=1, max_steps=3, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer = pl.Trainer(callbacks=callbacks, **{**settings, **kwargs})  # type: ignore[arg-type]
    trainer.fit(module, loader())
    return trainer


def no_tracer_left() -> bool:
    return not torch.nn.modules.module._global_forward_hooks and torch._C._len_torch_dispatch_stack() == 0


def both_lines(text: str) -> bool:
    return f"test_lightning_callback.py:{marker_line(__file__, 'write')}" in text and (
        f"test_lightning_callback.py:{marker_line(__file__, 'save')}" in text
    )


@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_a_clean_fit_is_silent_and_trains_as_without_the_callback(manual: bool, caplog: pytest.LogCaptureFixture) -> None:
    weights = []
    for callbacks in ([], [InplaceDoctorCallback(steps=2)]):
        torch.manual_seed(0)
        module = Regressor(manual=manual)
        with caplog.at_level(logging.INFO):
            fit(module, callbacks)
        weights.append([p.detach().clone() for p in module.parameters()])
    callback = callbacks[0]
    assert isinstance(callback, InplaceDoctorCallback) and callback.report is not None
    assert callback.report.findings == [] and no_tracer_left()
    assert all(torch.equal(a, b) for a, b in zip(*weights))  # bit-identical
    assert "inplace-doctor watched 2 training step(s) of Lightning fit of Regressor: no finding" in caplog.text


@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_a_broken_fit_fails_with_the_inplace_error_naming_both_lines(manual: bool) -> None:
    callback = InplaceDoctorCallback()
    with pytest.raises(ipd.InplaceError) as raised:
        fit(Regressor(broken=True, manual=manual), [callback])
    assert both_lines(str(raised.value)), str(raised.value)
    assert callback.report is not None and callback.report.codes == ["IPD101"]
    assert "model.net" in str(callback.report) and no_tracer_left()


@pytest.mark.parametrize(
    "manual,accumulate", [(False, 1), (True, 1), (False, 2)], ids=["automatic", "manual", "accumulate-2"]
)
def test_the_window_holds_the_optimizer_step_of_each_watched_step(manual: bool, accumulate: int) -> None:
    callback = InplaceDoctorCallback(steps=1)
    open_at_step: list[bool] = []
    handle = register_optimizer_step_post_hook(
        lambda *args: open_at_step.append(callback._window.is_open)
    )
    try:
        fit(Regressor(manual=manual), [callback], accumulate_grad_batches=accumulate, max_steps=2)
    finally:
        handle.remove()
    assert open_at_step == [True, False] and no_tracer_left()


def test_an_optimizer_step_before_a_retained_backward_is_caught_in_manual_optimization() -> None:
    callback = InplaceDoctorCallback()
    with pytest.raises(ipd.InplaceError) as raised:
        fit(StepBeforeBackward(manual=True), [callback])
    assert "model.net.head.weight" in str(raised.value), str(raised.value)
    assert no_tracer_left()
    # The backward is the user's `manual_backward` call, not the `loss.backward()` inside Lightning:
    # moving the step after it is an edit of this file.
    (finding,) = raised.value.findings
    (move,) = [f for f in finding.fixes if f.kind is FixKind.MOVE_STATEMENT]
    assert [(e.path, e.start.line) for e in move.edits][-1] == (__file__, marker_line(__file__, "second-backward"))


@pytest.mark.parametrize("fail_on", ["warning", "error", None])
def test_a_warning_fails_the_fit_after_the_window_only_at_fail_on_warning(fail_on: str | None) -> None:
    callback = InplaceDoctorCallback(steps=1, fail_on=fail_on)
    module = Regressor(clamps_input=True)
    if fail_on == "warning":
        with pytest.raises(InplaceHazardsFound) as raised:
            fit(module, [callback])
        assert f"test_lightning_callback.py:{marker_line(__file__, 'clamp')}" in str(raised.value)
        assert raised.value.report is callback.report
    else:
        assert fit(module, [callback]).global_step == 3  # the whole fit ran
    assert callback.report is not None and callback.report.codes == ["IPD106"] and no_tracer_left()
