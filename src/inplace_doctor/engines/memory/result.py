"""What `memory()` returns: the peaks of a training step, the categories of their bytes, and who held them.

`str(report)` is render/memory_text.py's summary (through `printing.Printable`); `to_dict()`
is the JSON the CLI prints, with every category and phase as its plain string.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ...printing import Printable
from ...sites import module_path
from ..training import StepPhase


class Category(StrEnum):
    """Why bytes are live: the first five known by identity, the last two by how they were made."""

    PARAMETERS = "parameters"
    BUFFERS = "buffers"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer state"
    INPUTS = "inputs"
    SAVED = "saved activations"  # storages autograd holds for backward
    TEMPORARIES = "temporaries"  # everything else an op allocated


# The phases memory reports a peak for, in step order.
PHASES = (StepPhase.FORWARD, StepPhase.BACKWARD, StepPhase.OPTIMIZER)


@dataclass(frozen=True)
class Holding:
    """Bytes held at a peak by one group of tensors, and why."""

    category: Category
    nbytes: int
    tensors: int
    label: str = ""  # `ConvolutionBackward0.input`, `conv2d output`, ...
    module: str | None = None  # the module's path relative to the model (`fc1`; "" the model itself)
    location: str | None = None  # file:line that saved (saved activations)
    node: str | None = None  # the autograd node that allocated a temporary in backward

    @property
    def where(self) -> str:
        """Who holds it, as reports name it: `model.fc1`, or the autograd node; "" when neither."""
        return module_path(self.module) if self.module is not None else self.node or ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": str(self.category),
            "bytes": self.nbytes,
            "tensors": self.tensors,
            "label": self.label,
            "module": self.where or None,
            "location": self.location,
        }


@dataclass
class Peak:
    """The largest live total within one phase of one step, and who held it."""

    phase: StepPhase
    step: int
    nbytes: int
    op_index: int  # the op after which it was reached, counted from the start of the step (1 = first)
    op: str
    where: str | None  # module path or autograd node of that op
    by_category: dict[str, int] = field(default_factory=dict)  # Category -> bytes
    holdings: list[Holding] = field(default_factory=list)
    allocator_peak: int | None = None  # CUDA: torch.cuda.max_memory_allocated in this phase

    def to_dict(self) -> dict[str, Any]:
        return {
            "phase": str(self.phase),
            "step": self.step,
            "bytes": self.nbytes,
            "op_index": self.op_index,
            "op": self.op,
            "where": self.where,
            "by_category": {str(category): n for category, n in self.by_category.items()},
            "holdings": [h.to_dict() for h in self.holdings],
            "allocator_peak": self.allocator_peak,
        }


@dataclass
class MemoryReport(Printable):
    """Memory of the measured training steps; `str(report)` is a text summary.

    `peak` is the largest live total over every measured step (what MemTracker
    reports over the same steps); `peaks` holds, for the last step, the peak of
    each phase with its breakdown; `timeline` the live total after every op of
    the last step as `(op index, phase, op name, bytes)`.
    """

    target: str
    mode: str
    optimizer: str | None
    steps: int
    peak: int
    step_peaks: list[int]
    peaks: dict[str, Peak]  # StepPhase -> its peak
    timeline: list[tuple[int, str, str, int]]  # the phase is a StepPhase
    baseline: int  # live bytes when the last step started
    device: str
    notes: list[str] = field(default_factory=list)
    #: each parameter group's hyperparameters (`training.optimizer_settings`): momentum, betas, ...
    optimizer_settings: tuple[dict[str, Any], ...] = ()

    @property
    def peak_phase(self) -> Peak:
        return max(self.peaks.values(), key=lambda p: p.nbytes)

    def saved_by_module(self, phase: str | None = None) -> list[tuple[str, int]]:
        """(module path relative to the model, "" the model itself; saved-activation bytes) at a phase's
        peak, largest first."""
        peak = self.peaks[phase] if phase else self.peak_phase
        totals: dict[str, int] = {}
        for h in peak.holdings:
            if h.category == Category.SAVED and h.module is not None:
                totals[h.module] = totals.get(h.module, 0) + h.nbytes
        return sorted(totals.items(), key=lambda kv: -kv[1])

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "mode": self.mode,
            "optimizer": self.optimizer,
            "optimizer_settings": [dict(g) for g in self.optimizer_settings],
            "steps": self.steps,
            "device": self.device,
            "peak_bytes": self.peak,
            "step_peaks": list(self.step_peaks),
            "baseline_bytes": self.baseline,
            "peaks": {str(phase): p.to_dict() for phase, p in self.peaks.items()},
            "timeline": [[i, str(phase), op, nbytes] for i, phase, op, nbytes in self.timeline],
            "notes": list(self.notes),
        }
