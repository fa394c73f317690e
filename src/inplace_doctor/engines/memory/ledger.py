"""Where memory goes in a training step, and why autograd keeps it.

`measure_memory(model, *args, optimizer=...)` runs training steps on deep
copies of the model and optimizer (the user's objects are never touched) under
a `_Ledger`: a `TorchDispatchMode` that registers every storage an op returns,
counts its bytes until the storage is freed (a weakref callback on the
storage, which PyTorch keeps alive exactly as long as its memory), and
samples the live total after every op. This is the accounting model of
`torch.distributed._tools.mem_tracker.MemTracker` — the same storages, counted
at the same moments — so the two peaks agree to the byte (tested); the
categories and attributions are ours:

- parameters, buffers, gradients, optimizer state and inputs are known by
  identity;
- saved activations are storages autograd holds for backward, named by the
  node and field that need them (`ConvolutionBackward0.input`), the module
  path and the source line that saved them (the tracer's saved-tensor hooks);
- everything else is a temporary, named by the op and module (forward) or the
  autograd node (backward) that allocated it.

The breakdown at a peak is taken lazily: when the total reaches a new
maximum the ledger only remembers that; the breakdown is computed at the
first free that follows (or at the end of the phase), when the set of live
storages is still exactly the one at the peak.

On CUDA the tracked bytes are rounded up to the caching allocator's 512-byte
blocks (as MemTracker does) and the allocator's own figures
(`torch.cuda.max_memory_allocated` per phase) are reported beside them.
"""

from __future__ import annotations

import copy
import gc
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch.utils._pytree import tree_leaves

from ... import _compat
from ...errors import UsageError
from ..preserve import RngState, private_inputs, tensors_in
from ...trace.stacks import make_site
from ...printing import fmt_bytes as _fmt_bytes
from ...trace.tracer import SavedPlace, Tracer

PHASES = ("forward", "backward", "optimizer")
CATEGORIES = (
    "parameters",
    "buffers",
    "gradients",
    "optimizer state",
    "inputs",
    "saved activations",
    "temporaries",
)
_CUDA_BLOCK = 512

# Ops PyTorch dispatches for its own bookkeeping, not the user's computation: the profiler's
# `record_function` markers (every `optimizer.step()` opens one) and asserts that return nothing.
# They allocate no storage; naming a peak after one would tell the user nothing.
_BOOKKEEPING_NAMESPACES = frozenset({"profiler"})
_BOOKKEEPING_PREFIXES = ("_record_function", "_profiler")
_BOOKKEEPING_OPS = frozenset({
    "_assert_async", "_assert_scalar", "_assert_tensor_metadata", "_functional_assert_async",
    "_functional_assert_scalar", "sym_constrain_range", "sym_constrain_range_for_size",
})


def is_bookkeeping_op(namespace: str, name: str) -> bool:
    """Whether an op (namespace `profiler`, name `_record_function_enter_new`) is PyTorch's
    internal bookkeeping rather than a computation the user's program asked for."""
    return namespace in _BOOKKEEPING_NAMESPACES or name.startswith(_BOOKKEEPING_PREFIXES) or name in _BOOKKEEPING_OPS


class _Entry:
    """One live storage."""

    __slots__ = ("nbytes", "device", "ptr", "category", "op", "owner", "phase")

    def __init__(self, nbytes: int, device: str, ptr: int, op: str, owner: str | None, phase: str) -> None:
        self.nbytes = nbytes
        self.device = device
        self.ptr = ptr
        self.category: str | None = None  # fixed categories; None: saved activation or temporary
        self.op = op
        self.owner = owner  # module path (forward) or autograd node (backward) that allocated it
        self.phase = phase


@dataclass(frozen=True)
class Holding:
    """Bytes held at a peak by one group of tensors, and why."""

    category: str
    nbytes: int
    tensors: int
    label: str = ""  # `ConvolutionBackward0.input`, `conv2d output`, ...
    module: str | None = None
    location: str | None = None  # file:line that saved (saved activations)

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "bytes": self.nbytes,
            "tensors": self.tensors,
            "label": self.label,
            "module": self.module,
            "location": self.location,
        }


@dataclass
class Peak:
    """The largest live total within one phase of one step, and who held it."""

    phase: str
    step: int
    nbytes: int
    op_index: int  # the op after which it was reached, counted from the start of the step (1 = first)
    op: str
    where: str | None  # module path or autograd node of that op
    by_category: dict[str, int] = field(default_factory=dict)
    holdings: list[Holding] = field(default_factory=list)
    allocator_peak: int | None = None  # CUDA: torch.cuda.max_memory_allocated in this phase

    def to_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "step": self.step,
            "bytes": self.nbytes,
            "op_index": self.op_index,
            "op": self.op,
            "where": self.where,
            "by_category": dict(self.by_category),
            "holdings": [h.to_dict() for h in self.holdings],
            "allocator_peak": self.allocator_peak,
        }


@dataclass
class MemoryReport:
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
    peaks: dict[str, Peak]
    timeline: list[tuple[int, str, str, int]]
    baseline: int  # live bytes when the last step started
    device: str
    notes: list[str] = field(default_factory=list)

    @property
    def peak_phase(self) -> Peak:
        return max(self.peaks.values(), key=lambda p: p.nbytes)

    def saved_by_module(self, phase: str | None = None) -> list[tuple[str, int]]:
        """(module path, saved-activation bytes) at a phase's peak, largest first."""
        peak = self.peaks[phase] if phase else self.peak_phase
        totals: dict[str, int] = {}
        for h in peak.holdings:
            if h.category == "saved activations" and h.module:
                totals[h.module] = totals.get(h.module, 0) + h.nbytes
        return sorted(totals.items(), key=lambda kv: -kv[1])

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "mode": self.mode,
            "optimizer": self.optimizer,
            "steps": self.steps,
            "device": self.device,
            "peak_bytes": self.peak,
            "step_peaks": list(self.step_peaks),
            "baseline_bytes": self.baseline,
            "peaks": {name: p.to_dict() for name, p in self.peaks.items()},
            "timeline": [list(row) for row in self.timeline],
            "notes": list(self.notes),
        }

    def __str__(self) -> str:
        from ...render.memory_text import memory_to_plain_text

        return memory_to_plain_text(self)


class _Ledger(_compat.TorchDispatchMode):
    """Live storages, their bytes and categories, sampled after every op."""

    def __init__(self, tracer: Tracer | None) -> None:
        super().__init__()
        self.tracer = tracer
        self._entries: dict[int, tuple[weakref.ref[Any], _Entry]] = {}  # id(storage) -> (ref, entry)
        self._ref_ids: dict[weakref.ref[Any], int] = {}
        self._on_free = self._free
        self.live = 0
        self.phase = "setup"
        self.ops = 0
        self.timeline: list[tuple[int, str, str, int]] = []
        self.step_peak = 0
        self.overall_peak = 0
        # phase -> [bytes, op index, op, where, snapshot or None, pending]
        self.peaks: dict[str, list[Any]] = {}
        self._pending: list[str] = []

    # -- registration ------------------------------------------------------
    def _storage(self, t: torch.Tensor) -> Any:
        try:
            if t.is_meta or t.is_sparse:
                return None
            return t.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):
            return None

    def track(self, t: torch.Tensor, category: str | None, op: str = "", owner: str | None = None) -> None:
        st = self._storage(t)
        if st is None:
            return
        known = self._entries.get(id(st))
        if known is not None and known[0]() is st:
            entry = known[1]
            nbytes = self._nbytes(st, entry.device)
            if nbytes != entry.nbytes:  # resized (`out=` ops, resize_)
                self.live += nbytes - entry.nbytes
                entry.nbytes = nbytes
            if category is not None:
                entry.category = category
            return
        device = str(t.device)
        nbytes = self._nbytes(st, device)
        entry = _Entry(nbytes, device, st.data_ptr(), op, owner, self.phase)
        entry.category = category
        ref = weakref.ref(st, self._on_free)
        self._entries[id(st)] = (ref, entry)
        self._ref_ids[ref] = id(st)
        self.live += nbytes

    @staticmethod
    def _nbytes(st: Any, device: str) -> int:
        n = int(st.nbytes())
        if device.startswith("cuda"):
            return -(-n // _CUDA_BLOCK) * _CUDA_BLOCK
        return n

    def _free(self, ref: weakref.ref[Any]) -> None:
        key = self._ref_ids.pop(ref, None)
        if key is None:
            return
        if self._pending:
            self._take_pending()
        _, entry = self._entries.pop(key)
        self.live -= entry.nbytes

    def release(self) -> None:
        """Forget every storage (the run is over): no callbacks into a dead ledger."""
        self._entries.clear()
        self._ref_ids.clear()

    # -- the op stream -----------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.__name__ if hasattr(func, "__name__") else str(func)
        name = str(name).split(".")[0]
        owner = self._owner()
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.track(t, None, name, owner)
        if is_bookkeeping_op(str(getattr(func, "namespace", "")), name):
            # Not an op of the user's step: no index, no timeline row, no peak named after it.
            # The totals still see it, so the overall peak stays MemTracker's to the byte.
            self.step_peak = max(self.step_peak, self.live)
            self.overall_peak = max(self.overall_peak, self.live)
            return out
        self.ops += 1
        self.timeline.append((self.ops, self.phase, name, self.live))
        if self.live > self.step_peak:
            self.step_peak = self.live
        if self.live > self.overall_peak:
            self.overall_peak = self.live
        state = self.peaks.get(self.phase)
        if state is None or self.live > state[0]:
            self.peaks[self.phase] = [self.live, self.ops, name, owner, None]
            if self.phase not in self._pending:
                self._pending.append(self.phase)
        return out

    def _owner(self) -> str | None:
        node = _compat.current_autograd_node()
        if node is not None:
            return str(node.name())
        if self.tracer is not None:
            ctx = self.tracer.modules.current
            if ctx is not None:
                return f"model.{ctx[0]}" if ctx[0] else "model"
        return None

    # -- breakdowns --------------------------------------------------------
    def _take_pending(self) -> None:
        snapshot = self.snapshot()
        for phase in self._pending:
            self.peaks[phase][4] = snapshot
        self._pending = []

    def end_phase(self) -> None:
        if self._pending:
            self._take_pending()

    def snapshot(self) -> list[tuple[_Entry, str | None, Any]]:
        """(entry, category, where the oldest saved tensor on it was saved, or None) of every live storage, now."""
        tracer = self.tracer
        rows = []
        # Every entry still counted: this runs inside the free callback of the
        # first storage released after the peak, whose weakref is already dead.
        for _, entry in self._entries.values():
            place = None
            if entry.category is None and tracer is not None:
                records = tracer.saved_records(entry.ptr)
                if records:
                    place = records[0].place()  # not the record: it holds the tensor
            rows.append((entry, entry.category, place))
        return rows

    def new_step(self) -> None:
        self.ops = 0
        self.step_peak = self.live
        self.peaks = {}
        self._pending = []
        self.timeline = []


def _breakdown(rows: list[tuple[_Entry, str | None, Any]]) -> tuple[dict[str, int], list[Holding]]:
    by_category = dict.fromkeys(CATEGORIES, 0)
    groups: dict[tuple[Any, ...], list[int]] = {}
    located = SavedPlace.resolve_all([place for _, _, place in rows if place is not None])
    for entry, category, place in rows:
        key: tuple[Any, ...]
        if category is not None:
            cat, key = category, (category, "", None, None)
        elif place is not None:
            cat = "saved activations"
            node = place.node or "<unnamed node>"
            label = f"{node}.{place.field}" if place.field else node
            frames, api, _ = located[id(place.stack)]
            module = place.module
            site = make_site(place.op or "", frames, api, module, "backward" if place.in_backward else "forward")
            module_path = None
            if module is not None:
                module_path = f"model.{module[0]}" if module[0] else "model"
            key = (cat, label, module_path, site.location if site.file else None)
        else:
            cat = "temporaries"
            verb = "output" if entry.phase != "backward" else "result"
            key = (cat, f"{entry.op} {verb}" if entry.op else "", entry.owner, None)
        by_category[cat] += entry.nbytes
        acc = groups.setdefault(key, [0, 0])
        acc[0] += entry.nbytes
        acc[1] += 1
    holdings = [
        Holding(category=k[0], nbytes=v[0], tensors=v[1], label=k[1], module=k[2], location=k[3])
        for k, v in groups.items()
    ]
    holdings.sort(key=lambda h: (-h.nbytes, h.category, h.label, h.module or ""))
    return by_category, holdings


# -- the driver ----------------------------------------------------------------

def copy_model_and_optimizer(model: torch.nn.Module, optimizer: Any) -> tuple[torch.nn.Module, Any]:
    """Deep copies sharing one memo, so the optimizer's parameters are the copy's; an optimizer
    given as `params -> optimizer` is built over the copy."""
    if optimizer is None:
        return copy.deepcopy(model), None
    if isinstance(optimizer, torch.optim.Optimizer):
        model_copy, opt_copy = copy.deepcopy((model, optimizer))
        return model_copy, opt_copy
    model_copy = copy.deepcopy(model)
    return model_copy, optimizer(model_copy.parameters())


def _private_copies(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Private copies of the inputs to measure on."""
    return copy.deepcopy(private_inputs(args)), copy.deepcopy(private_inputs(kwargs))


def _state_tensors(optimizer: Any) -> Iterator[torch.Tensor]:
    if optimizer is None:
        return
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


def training_step(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    loss_fn: Callable[[Any], torch.Tensor] | None,
    optimizer: Any,
    on_phase: Callable[[str], None] = lambda phase: None,
) -> None:
    """One step as measured: zero grads (set to None), forward and loss, backward,
    release the output and loss, optimizer step."""
    from ..audit import default_loss

    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    else:
        model.zero_grad(set_to_none=True)
    on_phase("forward")
    output = model(*args, **kwargs)
    loss = loss_fn(output) if loss_fn is not None else default_loss(output)
    if loss is None or not loss.requires_grad:
        raise ValueError("no output requires grad: pass loss_fn, or a model with trainable parameters")
    on_phase("backward")
    loss.backward()
    del output, loss
    if optimizer is not None:
        on_phase("optimizer")
        optimizer.step()
    on_phase("done")


def measure_memory(
    model: torch.nn.Module,
    *args: Any,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
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
    work_model, work_opt = copy_model_and_optimizer(model, optimizer)
    return measure_owned(work_model, work_opt, args, kwargs, loss_fn=loss_fn, steps=steps, target=model)


def measure_owned(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    steps: int = 2,
    target: torch.nn.Module | None = None,
) -> MemoryReport:
    """`measure_memory` on a model (and optimizer instance over it) the caller has already copied
    and gives up: no second copy. `target` names what the report is about (default: `model`)."""
    if steps < 1:
        raise UsageError(f"steps must be at least 1, got {steps}")
    rng = RngState()
    try:
        work_args, work_kwargs = _private_copies(args, kwargs)
        return _measure(target or model, model, optimizer, work_args, work_kwargs, loss_fn, steps)
    finally:
        rng.restore()


def _measure(
    original: torch.nn.Module,
    model: torch.nn.Module,
    optimizer: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    loss_fn: Callable[[Any], torch.Tensor] | None,
    steps: int,
) -> MemoryReport:
    tracer = Tracer(lambda event: None, track_call_inputs=False, observe_reads=False)
    tracer.modules.add_root(model)
    ledger = _Ledger(tracer)
    device = next((str(p.device) for p in model.parameters()), "cpu")
    cuda = device.startswith("cuda") and torch.cuda.is_available()
    allocator: dict[str, int] = {}

    def register_state() -> None:
        for p in model.parameters():
            ledger.track(p, "parameters")
            if p.grad is not None:
                ledger.track(p.grad, "gradients")
        for b in model.buffers():
            ledger.track(b, "buffers")
        for t in _state_tensors(optimizer):
            ledger.track(t, "optimizer state")
        for t in tensors_in((args, kwargs)):
            ledger.track(t, "inputs")

    def on_phase(phase: str) -> None:
        ledger.end_phase()
        if cuda and ledger.phase in PHASES:
            allocator[ledger.phase] = torch.cuda.max_memory_allocated()
        if phase == "optimizer" or phase == "done":
            for t in _state_tensors(optimizer):  # state created by the first step
                ledger.track(t, "optimizer state")
        ledger.phase = phase
        if cuda and phase in PHASES:
            torch.cuda.reset_peak_memory_stats()

    def mark_grad(p: torch.Tensor) -> None:
        if p.grad is not None:
            ledger.track(p.grad, "gradients")

    hooks = [p.register_post_accumulate_grad_hook(mark_grad) for p in model.parameters() if p.requires_grad]
    step_peaks: list[int] = []
    baseline = 0
    gc.collect()
    try:
        with tracer:
            register_state()
            with ledger:
                for step in range(1, steps + 1):
                    ledger.new_step()
                    baseline = ledger.live
                    allocator.clear()
                    try:
                        training_step(model, args, kwargs, loss_fn, optimizer, on_phase)
                    finally:
                        ledger.end_phase()
                    step_peaks.append(ledger.step_peak)
        peaks = {}
        for phase in PHASES:
            state = ledger.peaks.get(phase)
            if state is None:
                continue
            nbytes, op_index, op, where, rows = state
            by_category, holdings = _breakdown(rows or [])
            peaks[phase] = Peak(
                phase=phase,
                step=steps,
                nbytes=nbytes,
                op_index=op_index,
                op=op,
                where=where,
                by_category=by_category,
                holdings=holdings,
                allocator_peak=allocator.get(phase),
            )
        report = MemoryReport(
            target=type(original).__name__,
            mode="train" if original.training else "eval",
            optimizer=type(optimizer).__name__ if optimizer is not None else None,
            steps=steps,
            peak=ledger.overall_peak,
            step_peaks=step_peaks,
            peaks=peaks,
            timeline=list(ledger.timeline),
            baseline=baseline,
            device=device,
        )
        if len(step_peaks) > 1 and step_peaks[0] > step_peaks[-1]:
            report.notes.append(
                f"the first step peaked higher ({_fmt_bytes(step_peaks[0])}) than the last "
                f"({_fmt_bytes(step_peaks[-1])}): state allocated once (optimizer state, lazy buffers)"
            )
        return report
    finally:
        for h in hooks:
            h.remove()
        ledger.release()


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
        work = [(m, opt, *_private_copies(args, kwargs)) for m, opt in owned]
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
