"""Where memory goes in a training step, and why autograd keeps it.

`measure_memory(model, *args, optimizer=...)` runs training steps on deep
copies of the model and optimizer (the user's objects are never touched) under
a `Ledger` (ledger.py), which counts every storage to the byte as MemTracker
does; the categories and attributions are ours:

- parameters, buffers, gradients, optimizer state and inputs are known by
  identity;
- saved activations are storages autograd holds for backward, named by the
  node and field that need them (`ConvolutionBackward0.input`), the module
  path and the source line that saved them (the tracer's saved-tensor hooks);
- everything else is a temporary, named by the op and module (forward) or the
  autograd node (backward) that allocated it.

On CUDA the allocator's own figures (`torch.cuda.max_memory_allocated` per
phase) are reported beside the tracked bytes. `times_owned` times the same
training step, for optimize's comparisons.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ...errors import UsageError
from ...printing import fmt_bytes
from ...trace.tracer import Tracer
from ..preserve import RngState, private_copies, refuse_meta, tensors_in
from ..training import LossFn, StepPhase, copy_for_training, optimizer_settings, training_step
from .ledger import Ledger, breakdown
from .result import PHASES, Category, MemoryReport, Peak


def _state_tensors(optimizer: Any) -> Iterator[torch.Tensor]:
    if optimizer is None:
        return
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


def measure_memory(
    model: torch.nn.Module,
    *args: Any,
    loss_fn: LossFn | None = None,
    optimizer: Any = None,
    steps: int = 2,
    **kwargs: Any,
) -> MemoryReport:
    """Measure `steps` training steps on copies of `model` (and `optimizer`).

    Args:
        model: the model, in the mode (train/eval) to measure.
        *args, **kwargs: its inputs.
        loss_fn: output -> scalar loss; default: the sum of the floating outputs.
        optimizer: an optimizer over `model`'s parameters (deep-copied with the
            model), or a callable `params -> optimizer`; None: forward and
            backward only.
        steps: steps to run; the breakdowns are those of the last one (by
            then the optimizer's state exists, as in a long run).

    The user's model, optimizer, inputs and global RNG state are left as found.
    """
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"memory() needs a torch.nn.Module, got {type(model).__name__}")
    if steps < 1:
        raise UsageError(f"steps must be at least 1, got {steps}")
    refuse_meta(model, tensors_in((args, kwargs)), "memory")
    work_model, work_opt = copy_for_training(model, optimizer)
    return measure_owned(work_model, work_opt, args, kwargs, loss_fn=loss_fn, steps=steps, target=model)


def measure_owned(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    loss_fn: LossFn | None = None,
    steps: int = 2,
    target: torch.nn.Module | None = None,
) -> MemoryReport:
    """`measure_memory` on a model (and optimizer instance over it) the caller has already copied
    and gives up: no second copy. `target` names what the report is about (default: `model`)."""
    if steps < 1:
        raise UsageError(f"steps must be at least 1, got {steps}")
    rng = RngState()
    try:
        work_args, work_kwargs = private_copies(args, kwargs)
        return _Measurement(model, optimizer, work_args, work_kwargs).run(target or model, loss_fn, steps)
    finally:
        rng.restore()


class _Measurement:
    """One measured run: the ledger over a model, its optimizer and inputs, step by step."""

    def __init__(self, model: torch.nn.Module, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.model, self.optimizer, self.args, self.kwargs = model, optimizer, args, kwargs
        self.tracer = Tracer(lambda event: None, track_call_inputs=False, observe_reads=False)
        self.tracer.modules.add_root(model)
        self.ledger = Ledger(self.tracer)
        self.device = next((str(p.device) for p in model.parameters()), "cpu")
        self.cuda = self.device.startswith("cuda") and torch.cuda.is_available()
        self.allocator: dict[str, int] = {}  # phase -> torch.cuda.max_memory_allocated in it

    def register_state(self) -> None:
        ledger = self.ledger
        for p in self.model.parameters():
            ledger.track(p, Category.PARAMETERS)
            if p.grad is not None:
                ledger.track(p.grad, Category.GRADIENTS)
        for b in self.model.buffers():
            ledger.track(b, Category.BUFFERS)
        for t in _state_tensors(self.optimizer):
            ledger.track(t, Category.OPTIMIZER_STATE)
        for t in tensors_in((self.args, self.kwargs)):
            ledger.track(t, Category.INPUTS)

    def on_phase(self, phase: StepPhase) -> None:
        ledger = self.ledger
        ledger.end_phase()
        if self.cuda and ledger.phase in PHASES:
            self.allocator[ledger.phase] = torch.cuda.max_memory_allocated()
        if phase == StepPhase.OPTIMIZER or phase == StepPhase.DONE:
            for t in _state_tensors(self.optimizer):  # state created by the first step
                ledger.track(t, Category.OPTIMIZER_STATE)
        ledger.phase = phase
        if self.cuda and phase in PHASES:
            torch.cuda.reset_peak_memory_stats()

    def mark_grad(self, p: torch.Tensor) -> None:
        if p.grad is not None:
            self.ledger.track(p.grad, Category.GRADIENTS)

    def run(self, original: torch.nn.Module, loss_fn: LossFn | None, steps: int) -> MemoryReport:
        ledger = self.ledger
        hooks = [p.register_post_accumulate_grad_hook(self.mark_grad) for p in self.model.parameters() if p.requires_grad]
        step_peaks: list[int] = []
        baseline = 0
        if self.cuda:
            # Only the allocator's figures see garbage an earlier run left in reference cycles (the
            # ledger counts the storages it saw allocated); a full collection walks the whole heap,
            # which costs more than a small model's step, once per configuration optimize measures.
            gc.collect()
        try:
            with self.tracer:
                self.register_state()
                with ledger:
                    for _ in range(steps):
                        ledger.new_step()
                        baseline = ledger.live
                        self.allocator.clear()
                        try:
                            training_step(self.model, self.args, self.kwargs, loss_fn, self.optimizer, self.on_phase)
                        finally:
                            ledger.end_phase()
                        step_peaks.append(ledger.step_peak)
            return self.report(original, steps, step_peaks, baseline)
        finally:
            for h in hooks:
                h.remove()
            ledger.release()

    def peaks(self, steps: int) -> dict[str, Peak]:
        peaks: dict[str, Peak] = {}
        for phase in PHASES:
            state = self.ledger.peaks.get(phase)
            if state is None:
                continue
            nbytes, op_index, op, where, rows = state
            by_category, holdings = breakdown(rows or [])
            peaks[phase] = Peak(
                phase=phase,
                step=steps,
                nbytes=nbytes,
                op_index=op_index,
                op=op,
                where=where,
                by_category=by_category,
                holdings=holdings,
                allocator_peak=self.allocator.get(phase),
            )
        return peaks

    def report(self, original: torch.nn.Module, steps: int, step_peaks: list[int], baseline: int) -> MemoryReport:
        report = MemoryReport(
            target=type(original).__name__,
            mode="train" if original.training else "eval",
            optimizer=type(self.optimizer).__name__ if self.optimizer is not None else None,
            optimizer_settings=optimizer_settings(self.optimizer),
            steps=steps,
            peak=self.ledger.overall_peak,
            step_peaks=step_peaks,
            peaks=self.peaks(steps),
            timeline=list(self.ledger.timeline),
            baseline=baseline,
            device=self.device,
        )
        if len(step_peaks) > 1 and step_peaks[0] > step_peaks[-1]:
            report.notes.append(
                f"the first step peaked higher ({fmt_bytes(step_peaks[0])}) than the last "
                f"({fmt_bytes(step_peaks[-1])}): state allocated once (optimizer state, lazy buffers)"
            )
        return report


def times_owned(
    owned: list[tuple[torch.nn.Module, torch.optim.Optimizer | None]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    repeat: int = 3,
) -> list[float]:
    """Seconds of one plain training step of each (model, optimizer) pair, which the caller has
    copied and gives up (minimum of `repeat`, after one warm-up). The pairs are stepped in
    interleaved rounds (each round steps every model once), so that drift in the machine's
    speed affects them alike."""
    rng = RngState()
    try:
        work = [(m, opt, *private_copies(args, kwargs)) for m, opt in owned]
        best = [float("inf")] * len(work)
        for i in range(repeat + 1):
            for k, (work_model, work_opt, work_args, work_kwargs) in enumerate(work):
                start = time.perf_counter()
                training_step(work_model, work_args, work_kwargs, loss_fn, work_opt)
                elapsed = time.perf_counter() - start
                if i:
                    best[k] = min(best[k], elapsed)
        return best
    finally:
        rng.restore()
