"""Running a program for verify: on its own deep copy, with chosen in-place sites forced off, a stage at a time.

Module `inplace` flags are switched on the copy; functional `inplace=True`
arguments (`F.relu(x, inplace=True)`) cannot be, so `FunctionalInplace`, a
`TorchFunctionMode`, records those calls by their line and forces the chosen
ones to `inplace=False`. Explicit `relu_()` and `+=` are the program's meaning
and stay. `stages` runs the training steps (training.py's driver) and yields
every tensor they produce, a stage at a time; `isolated` gives a run its own
RNG stream, so two runs can advance in turns.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ...trace.places.stacks import called_by_a_torch_module, capture_frames
from ...trace.raised.blame import call_through
from ..preserve import RngState, labelled_tensors, private_copy, tensors_in
from ..training import LossFn, StepPhase, ZeroGrad, compute_loss, copy_for_training, step_phases
from .result import InplaceSite

Stage = list[tuple[str, torch.Tensor]]


class FunctionalInplace(TorchFunctionMode):
    """Records inplace=True calls made outside torch.nn's modules (`seen`, as `file:line`);
    forces those in `off` to inplace=False (`off=None`: every one; an empty set: none)."""

    def __init__(self, off: set[str] | None) -> None:
        super().__init__()
        self.off = off
        self.seen: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        # module flags are switched on the module
        if kwargs.get("inplace") is True and not called_by_a_torch_module(sys._getframe(1)):
            frames, _ = capture_frames()
            where = f"{frames[-1][0]}:{frames[-1][1]}" if frames else "<unknown>"
            if where not in self.seen:
                self.seen.append(where)
            if self.off is None or where in self.off:
                kwargs = {**kwargs, "inplace": False}
        return call_through(func, args, kwargs)


def module_sites(model: torch.nn.Module, flags: Mapping[str, bool] | None = None) -> list[InplaceSite]:
    """The module flags that are on (with `flags` applied over the model's own)."""
    flags = flags or {}
    return [
        InplaceSite("module", name)
        for name, m in model.named_modules()
        if flags.get(name, m.__dict__.get("inplace")) is True
    ]


def clone_inputs(value: Any) -> Any:
    """The inputs copied for one run (`private_copy`): tensors that share memory still do, a leaf
    keeps its requires_grad, a non-leaf that requires grad stays a non-leaf (an in-place write to
    it is legal, as in the program), and each `torch.Generator` is the run's own copy at the
    caller's state (the configured and baseline runs draw the same numbers; the caller's does not move)."""
    return private_copy(value)


def stages(
    model: torch.nn.Module,
    flags: Mapping[str, bool] | None,
    off_modules: set[str] | None,
    args: Any,
    kwargs: Any,
    loss_fn: LossFn | None,
    steps: int,
    optimizer: Any,
) -> Iterator[Stage]:
    """One run on a deep copy of `model` (made when the run starts, released when it ends), with
    `flags` set and the module flags in `off_modules` (None: all) switched off: every tensor a
    training step produces, by name, a stage at a time — the step's outputs, loss and
    gradients; the parameters after the optimizer's step; at the end the buffers and the inputs.

    Each run builds a fresh optimizer (`optimizer`'s type and defaults, or the callable), and
    zeroes gradients after the optimizer's step only: without an optimizer they accumulate.
    A stage's tensors are the run's own, not copies: read them before the run resumes.
    """
    model, opt = copy_for_training(model, optimizer, flags=flags, fresh_optimizer=True)
    for name, m in model.named_modules():
        if m.__dict__.get("inplace") is True and (off_modules is None or name in off_modules):
            m.inplace = False
    args, kwargs = clone_inputs((args, kwargs))
    inputs = labelled_tensors(args, kwargs)
    for _, t in inputs:
        if t.requires_grad and not t.is_leaf:
            t.retain_grad()  # its gradient is compared as a leaf's is (in the program it flows on upstream)
    for step in range(1, steps + 1):
        tag = f" (step {step})" if steps > 1 else ""
        stage: Stage = []

        # B023: called within this iteration only (by step_phases below), so it reads this step's stage and tag
        def observed_loss(output: Any) -> Any:
            """The loss, after reading the outputs (a loss_fn may write them in place)."""
            stage.extend((f"output[{i}]{tag}", t.detach().clone()) for i, t in enumerate(tensors_in(output)))  # noqa: B023
            loss = compute_loss(output, loss_fn)
            if isinstance(loss, torch.Tensor) and loss.requires_grad:
                stage.append((f"loss{tag}", loss.detach()))  # noqa: B023
            return loss

        phases = step_phases(
            model, args, kwargs, observed_loss, opt, zero_grad=ZeroGrad.AFTER_OPTIMIZER, require_grad=False
        )
        for phase in phases:
            if phase is StepPhase.OPTIMIZER or (phase is StepPhase.DONE and opt is None):  # after backward
                stage += [(f"grad of {name}{tag}", p.grad) for name, p in model.named_parameters() if p.grad is not None]
                stage += [(f"grad of input {label}{tag}", t.grad) for label, t in inputs if t.grad is not None]
                yield stage
            elif phase is StepPhase.DONE:  # after the optimizer's step
                yield [(f"parameter {name} after step {step}", p.detach()) for name, p in model.named_parameters()]
    yield [(f"buffer {name}", b.detach()) for name, b in model.named_buffers()]
    yield [(f"input {label} after the call", t.detach()) for label, t in inputs]


def isolated(stages: Iterator[Stage], start: RngState, mode: FunctionalInplace) -> Iterator[Stage]:
    """`stages` run with an RNG stream of their own (from `start`) and under `mode`, so that two
    runs can advance in turns and each still sees what it would have seen alone."""
    state = start
    while True:
        state.restore()
        with mode:
            try:
                stage = next(stages)
            except StopIteration:
                return
        state = RngState()
        yield stage
