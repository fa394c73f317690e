"""InplaceDoctorCallback in a real `transformers.Trainer.train()` (CPU, a tiny GPT-2 built from a config)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import marker_line
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # Trainer needs it; CI installs both through '.[test]'

import inplace_doctor as ipd  # noqa: E402
from inplace_doctor.integrations import InplaceHazardsFound  # noqa: E402
from inplace_doctor.integrations.transformers import InplaceDoctorCallback  # noqa: E402


class BrokenActivation(nn.Module):
    """GPT-2's MLP activation, planted with an in-place bug that PyTorch reports only at backward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(x)  # <save>
        y.mul_(x)  # <write>
        return y


class ClampsInputIds(transformers.GPT2LMHeadModel):
    """GPT-2 whose forward clamps the batch's `input_ids` in place: the Trainer's own tensor, which it
    reads again after the call (`floating_point_ops`, the token count); PyTorch raises nothing."""

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, **kwargs: object) -> object:
        input_ids.clamp_(max=30)  # <clamp>
        return super().forward(input_ids=input_ids, labels=labels, **kwargs)


class RaisesAtStep2(transformers.GPT2LMHeadModel):
    """GPT-2 whose forward fails on its second call (a corrupt batch met in the model)."""

    calls = 0
    watched_when_raised = False

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, **kwargs: object) -> object:
        self.calls += 1
        if self.calls == 2:
            self.watched_when_raised = watching()
            raise ValueError("forward: batch 2 is corrupt")
        return super().forward(input_ids=input_ids, labels=labels, **kwargs)


def tiny_gpt2(broken: str = "") -> nn.Module:
    config = transformers.GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=1, n_head=2)
    kind = {"clamps_input": ClampsInputIds, "raises_at_step_2": RaisesAtStep2}.get(broken, transformers.GPT2LMHeadModel)
    model = kind(config)
    if broken == "backward":
        model.transformer.h[0].mlp.act = BrokenActivation()
    return model


class Tokens(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.ids = torch.randint(0, 32, (16, 8), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def trainer_for(
    model: nn.Module, callbacks: list, tmp_path: Path, collator: object = None, **kwargs: object
) -> transformers.Trainer:
    settings: dict[str, object] = dict(
        output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4, learning_rate=1e-2,
        report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True,
        dataloader_num_workers=0,
    )
    args = transformers.TrainingArguments(**{**settings, **kwargs})  # type: ignore[arg-type]
    return transformers.Trainer(
        model=model, args=args, train_dataset=Tokens(), callbacks=callbacks, data_collator=collator  # type: ignore[arg-type]
    )


def train(model: nn.Module, callbacks: list, tmp_path: Path, **kwargs: object) -> transformers.Trainer:
    trainer = trainer_for(model, callbacks, tmp_path, **kwargs)
    trainer.train()
    return trainer


def watching() -> bool:
    """The tool's saved-tensor hooks are installed (a watch window is open; both tracers install them)."""
    return torch._C._autograd._top_saved_tensors_default_hooks(False) is not None


def no_tracer_left() -> bool:
    """No hook, mode or saved-tensor hooks of the tool still installed in torch's global state."""
    mm = torch.nn.modules.module
    return (
        not mm._global_forward_pre_hooks
        and not mm._global_forward_hooks
        and torch._C._len_torch_dispatch_stack() == 0
        and torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    )


def test_a_clean_run_prints_one_line_and_trains_as_without_the_callback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weights = []
    for callbacks in ([], [InplaceDoctorCallback(steps=2)]):
        torch.manual_seed(0)
        model = tiny_gpt2()
        trainer = train(model, callbacks, tmp_path)
        weights.append([p.detach().clone() for p in model.parameters()])
    callback = callbacks[0]
    assert isinstance(callback, InplaceDoctorCallback) and callback.report is not None
    assert callback.report.findings == [] and no_tracer_left()
    assert all(torch.equal(a, b) for a, b in zip(*weights))  # bit-identical
    printed = [line for line in capsys.readouterr().out.splitlines() if "inplace-doctor" in line]
    assert printed == ["inplace-doctor watched 2 training step(s) of Trainer.train of GPT2LMHeadModel: no finding"]
    assert {"inplace_doctor/findings": 0.0}.items() <= trainer.state.log_history[0].items()


def test_a_bug_that_raises_at_backward_fails_train_with_the_inplace_error_naming_both_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    callback = InplaceDoctorCallback()
    with pytest.raises(ipd.InplaceError) as raised:
        train(tiny_gpt2(broken="backward"), [callback], tmp_path)
    assert "watched 0 training step(s) of Trainer.train of GPT2LMHeadModel: 1 finding(s): 1 error" in capsys.readouterr().out
    text = str(raised.value)
    for marker in ("write", "save"):
        assert f"test_hf_trainer_callback.py:{marker_line(__file__, marker)}" in text, text
    assert callback.report is not None and callback.report.codes == ["IPD101"]
    assert "model.transformer.h.0.mlp.act" in str(callback.report) and no_tracer_left()


@pytest.mark.parametrize("accumulate", [1, 2])
def test_the_window_holds_the_optimizer_step_of_each_watched_step(tmp_path: Path, accumulate: int) -> None:
    callback = InplaceDoctorCallback(steps=1)
    open_at_step: list[bool] = []
    handle = register_optimizer_step_post_hook(lambda *args: open_at_step.append(callback._window.is_open))
    try:
        train(tiny_gpt2(), [callback], tmp_path, max_steps=2, gradient_accumulation_steps=accumulate)
    finally:
        handle.remove()
    assert open_at_step == [True, False] and no_tracer_left()


@pytest.mark.parametrize("fail_on", ["warning", "error"])
def test_a_warning_fails_train_after_the_window_only_at_fail_on_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fail_on: str
) -> None:
    # The Trainer calls `model(**inputs)`: the clamped `input_ids` is a keyword argument of the call.
    callback = InplaceDoctorCallback(steps=1, fail_on=fail_on)
    clamp = f"test_hf_trainer_callback.py:{marker_line(__file__, 'clamp')}"
    if fail_on == "warning":
        with pytest.raises(InplaceHazardsFound) as raised:
            train(tiny_gpt2(broken="clamps_input"), [callback], tmp_path)
        assert "IPD106" in str(raised.value) and clamp in str(raised.value), str(raised.value)
        assert "(fail_on=warning); the fit is stopped" in str(raised.value)
        assert raised.value.report is callback.report
    else:
        trainer = train(tiny_gpt2(broken="clamps_input"), [callback], tmp_path)
        assert trainer.state.global_step == 3  # the whole run trained
        assert {"inplace_doctor/warnings": 1.0, "inplace_doctor/errors": 0.0}.items() <= (
            trainer.state.log_history[0].items()
        )
    printed = capsys.readouterr().out
    assert "watched 1 training step(s) of Trainer.train of ClampsInputIds: 1 finding(s): 1 warning" in printed
    assert clamp in printed and "`argument input_ids of ClampsInputIds`" in printed
    assert callback.report is not None and callback.report.codes == ["IPD106"] and no_tracer_left()


class FailingCollator:
    """Stacks the batch like `default_data_collator`, and fails on its third batch: the DataLoader
    `Trainer` iterates fetches one batch ahead, so that is while step 2's batches are fetched, after
    the window opened in step 1, outside the calls the callback guards."""

    def __init__(self) -> None:
        self.batches = 0
        self.error = ValueError("collator: batch 3 is corrupt")
        self.watched_when_raised = False

    def __call__(self, features: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        self.batches += 1
        if self.batches == 3:
            self.watched_when_raised = watching()
            raise self.error
        return transformers.default_data_collator(features)  # type: ignore[no-any-return]


@pytest.mark.parametrize("where", ["collator", "forward"])
def test_an_error_inside_the_window_closes_it_and_leaves_train_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    # The collator raises outside the calls the callback guards, the forward inside one (the
    # `training_step`); either way the window closes and train() raises the error itself.
    callback = InplaceDoctorCallback(steps=3)
    collator = FailingCollator() if where == "collator" else None
    model = tiny_gpt2(broken="raises_at_step_2" if where == "forward" else "")
    trainer = trainer_for(model, [callback], tmp_path, collator=collator)
    with pytest.raises(ValueError, match="is corrupt") as raised:
        trainer.train()
    failed = collator if collator is not None else model
    assert failed.watched_when_raised  # the error came while the tool watched
    if collator is not None:
        assert raised.value is collator.error
    assert type(raised.value) is ValueError and raised.value.__cause__ is None
    assert not callback._window.is_open and no_tracer_left()
    assert "training_step" not in vars(trainer)  # the guard undone: the class's method again
    assert callback.report is not None and callback.report.findings == []
    assert f"watched 1 training step(s) of Trainer.train of {type(model).__name__}: no finding" in capsys.readouterr().out
