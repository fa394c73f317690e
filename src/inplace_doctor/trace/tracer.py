"""One instrumented run: every write, every saved tensor, and when it is released.

The tracer owns a private `TorchDispatchMode` (writes), `saved_tensors_hooks`
(saves, with its own version re-check at unpack), autograd's node-creation hook
(which node and field hold each saved tensor) and global module hooks (module
paths). It reports `events` to a sink and knows nothing about rules.

Writes that bypass the dispatcher (through memory handed out by `.numpy()`,
DLPack or `data_ptr()`) are found by content checks (`contents.py`): saved
tensors on handed-out memory are fingerprinted at save and compared at unpack;
with `check_contents` every saved tensor is, and the writing line is looked for.

Known limitations:
- Writes that PyTorch makes without a dispatch-visible write or a version bump
  are invisible unless they change a saved tensor that is content-checked:
  BatchNorm's running-statistic update, writes to inference tensors, writes
  through memory handed out before the tracer started (or by a buffer protocol
  no hand-out call sees), which only `check_contents` catches.
- Inside a non-reentrant `torch.utils.checkpoint` region the checkpoint's own
  saved-tensor hooks replace ours: saves there are rebuilt on recompute, and
  PyTorch does not check their versions either, so neither do we. What holds
  instead: each op the region runs leaves an exact fingerprint of its outputs,
  and its recompute's values are compared with them, op by op
  (`recompute.py`, IPD111). Writes there to tensors saved outside the region
  are seen. The reentrant form's recompute is not compared.
- Tensors saved before the tracer started are checked by PyTorch itself, not
  by the tracer; an error they raise is still recognised by its message.
- `torch.compile`d code runs eagerly while the tracer runs (`compiled.py`);
  TorchScript modules are traced op by op, without their Python lines.
- Dispatch modes and saved-tensor hooks are per thread: threads the traced code
  starts run untraced; `threads` (`threads.py`) counts the ops they ran, so the
  report can say so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from .. import _compat, events
from ..events import Event, InplaceErrorRaised
from .checkpoint.checkpoint_blocks import RegionCount
from .checkpoint.checkpoint_ops import RegionOps
from .checkpoint.recompute import RecomputeCheck
from .deep.dispatch_mode import EnteredMode, SubclassConstruction, TracingMode
from .deep.per_op import disable_dynamo_directly
from .fast.fast_writes import FastWrites
from .fast.inplace_entry import InplaceEntries
from .fast.pending_reads import PendingReads
from .fast.saved_fast import FastSavedTensors
from .fast.suspect_calls import SuspectCalls
from .fast.write_kernels import end_linger
from .owner import Busy, Sink
from .places.entry_points import EntryPoints
from .places.modules import ModulePaths
from .places.origins import ConstructionRecorder
from .places.stacks import choose_stack_capture
from .process.compiled import EagerCompiled
from .process.fast_paths import fused_paths
from .process.threads import StartedThreads
from .process.transforms import FunctionalTransforms
from .raised.blame import recursion_headroom
from .raised.pytorch_errors import RaisedErrors, written_here
from .raised.raised_calls import RaisedCalls
from .reads.aliases import HeldTensors
from .reads.graph_writes import UnrecordedWrites
from .reads.inplace_calls import InplaceCalls
from .saves.contents import ContentChecks
from .saves.saved import NodeCreationHook, SavedRecord, SavedTensors
from .writes import WriteRecorder


class Tracer:
    """Context manager that records writes and saved tensors and reports events.

    Args:
        sink: receives each event; may return an exception for the tracer to
            raise at that point (fail-fast, or the stale-tensor error at unpack).
        fail_fast: also settle writes as soon as the user-level call returns.
        before_write: called with each tensor an op is about to write (audit
            uses it to snapshot the caller's parameters and inputs).
        track_call_inputs: treat the arguments of each top-level module call
            as the caller's inputs (audit names them itself instead).
        observe_reads: watch in-place calls, `state_dict()` holders and memory
            handed out of PyTorch (IPD105, IPD107, IPD109). Off for memory
            measurement: measuring a change allocates.
        check_contents: fingerprint every saved tensor (not only those on
            handed-out memory) and look for the line that wrote one (IPD109).
        fast: see writes through Python kernels at `ADInplaceOrView` instead of
            a dispatch mode seeing every op (`fast_writes.py`, issue 26): only
            writes and saves enter Python. It has no `observe_reads` features
            but stale `state_dict()` aliases (IPD107) and graph tensors changed
            outside autograd (IPD110), whose reads it sees through a dispatch
            mode pushed only while one is pending (`pending_reads.py`), and
            in-place calls (IPD105, IPD106: `inplace_calls`, its function mode
            on only while an in-place call runs or a read is awaited,
            `inplace_entry.py`, with a dispatch mode only for a call handed
            what one overwrote, `suspect_calls.py`),
            memory handed out (IPD109), seen by wrapping the Tensor methods
            that hand it out (`hand_outs.py`); it names a saving node's op by
            the node. Inside `torch.utils.checkpoint` regions (their forward
            and recompute) it runs per op, as the deep tracer does, for IPD108
            and IPD111 (`checkpoint_ops.py`).

    It is the `TraceOwner` of its helpers (`inplace_calls`, `held`).
    """

    def __init__(
        self,
        sink: Sink,
        *,
        fail_fast: bool = False,
        before_write: Callable[[torch.Tensor], None] | None = None,
        track_call_inputs: bool = True,
        observe_reads: bool = True,
        check_contents: bool = False,
        fast: bool = False,
    ) -> None:
        self._sink = sink
        self.fast = fast
        measuring = not observe_reads  # memory measurement: no fingerprints, which allocate
        self._checks_contents = not measuring  # IPD109's hand-outs and fingerprints, in both tracers
        if fast:
            observe_reads = False
        self._observe_reads = observe_reads
        self._fail_fast = fail_fast
        self._busy = Busy()
        self.modules = ModulePaths()
        self.entry_points = EntryPoints(self.modules)  # calls no forward hook sees: `__call__`, a bare `forward`
        self.inplace_calls = InplaceCalls(self, self.modules)
        self.inplace_calls.settles_writes = fail_fast  # `user_call_returned` settles nothing otherwise
        self.held = HeldTensors(self, self.modules)
        self._saved = (FastSavedTensors if fast else SavedTensors)(sink, self.emit, self.modules, self._busy)
        self.contents = ContentChecks(self._saved, self.emit, check_contents, self._busy, wrap_methods=fast)
        if self._checks_contents:
            self._saved.contents = self.contents
        if observe_reads:
            self.inplace_calls.on_hand_out = self.contents.handed_out
        # Fingerprinting allocates (memory measurement turns it off with observe_reads), and costs
        # inside checkpoint regions: skipped when the sink says no rule reads it (`--ignore IPD111`).
        wants = getattr(sink, "wants", None)
        check = not measuring and (wants is None or wants(events.CheckpointRecomputeDiffers))
        self._recompute = RecomputeCheck(self.emit, self.modules) if check else None
        self._writes = WriteRecorder(
            self.emit, self.modules, self._saved, self.held, self._busy, before_write, track_call_inputs,
            self._recompute,
        )
        self.modules.on_top_level = self._writes.on_top_level_call
        self.modules.on_top_level_output = self._writes.on_top_level_returned
        if observe_reads:  # the mode that sees `inplace=True` arguments runs only then
            self._writes.in_flag_call = lambda: self.inplace_calls.flag_calls > 0
        self._raised = RaisedErrors()
        self._saved.on_raised = self._raised.raised_in_backward
        #: `torch.compile`d code runs eagerly while tracing; `compiled.calls` counts it
        self.compiled = EagerCompiled()
        #: threads started while tracing, which the tracer does not see into
        self.threads = StartedThreads()
        self._graph = UnrecordedWrites(self.emit, self.modules, self._saved, self._writes.describe, self._busy)
        self._pack = self._saved.pack  # one bound method: the dispatch mode knows it on top of the hooks
        #: `torch.func.grad`/`vjp`/`jacrev`/`hessian` run with our saved-tensor hooks set aside
        self.transforms = FunctionalTransforms(self._pack, self._saved.unpack)
        #: the program's saved-tensor hooks were on top when the run began: ours were not set
        self.program_hooks = False
        self._mode = TracingMode(
            self._busy, self._saved, self._writes, self.inplace_calls, self.held, self._raised, self._graph,
            self._recompute, self._pack,
        )
        #: the fast tracer's per-op interception while a stale held alias awaits its use (IPD107)
        self._fast: FastWrites | None = None
        self.pending_reads: PendingReads | None = None
        self.checkpoint_ops: RegionOps | None = None
        if fast:
            self.pending_reads = PendingReads(self._busy, self.held, self._graph)
            assert isinstance(self._saved, FastSavedTensors)
            self._fast = FastWrites(self._busy, self._saved, self._writes, self._raised, self.pending_reads)
            if check or (not measuring and (wants is None or wants(events.SideEffectRepeated))):  # per op in regions
                self.checkpoint_ops = RegionOps(self._busy, self._writes, self._raised, self._recompute, self._pack)
            if wants is None or wants(events.OriginalValueRead) or wants(events.CallerInputWritten):
                self._watch_calls(measures=wants is None or wants(events.OriginalValueRead))
        self._contexts: list[Any] = []
        self._active = False

    # -- lifecycle -------------------------------------------------------
    @property
    def active(self) -> bool:
        """Whether the tracer is entered and not yet left."""
        return self._active

    def __enter__(self) -> Tracer:
        if self._active:
            raise RuntimeError("this Tracer is already active")
        self._active = True
        choose_stack_capture()
        self.modules.__enter__()
        self._contexts = [self.modules]
        try:
            self._enter(self.entry_points)
            self._enter(recursion_headroom())  # the frames the hooks and modes add, given back to the program
            self._enter(self.compiled)
            self._enter(self.threads)
            self._enter(NodeCreationHook(self._saved.on_node if self._fast is None else self._fast.on_node))
            self._enter(self._saved_tensors_hooks())
            self._enter(self.transforms)
            self._enter(fused_paths())  # torch's fused attention paths as without the tool's function mode
            if self._fast is not None:
                self._enter(self._fast)
                if self._checks_contents:  # not measuring memory: in-place calls PyTorch refuses, caught or not (the deep mode sees them)
                    self._enter(RaisedCalls(self._raised.noting(self.modules, self._busy)))
            else:
                disable_dynamo_directly()
                end_linger()  # the deep tracer runs where no fast session's kernels linger
                self._enter(EnteredMode(self._mode))
                self._enter(SubclassConstruction(self._mode))
            if self._recompute is not None or self.checkpoint_ops is not None:
                self._enter(RegionCount())
            if self.checkpoint_ops is not None:
                self._enter(self.checkpoint_ops)
            self._enter(ConstructionRecorder())  # models built inside (a script under `run`): flag fixes' lines
            # Also settles writes as the user-level call returns when fail_fast,
            # so the raise points at the line that overwrote.
            if self._observe_reads:
                self._enter(self.inplace_calls)
                self._enter(self.held)
                self._enter(self.contents)
            elif self.pending_reads is not None:
                self._enter(self.held)
                self._enter(self.pending_reads)
                region_modes = [self.checkpoint_ops.mode] if self.checkpoint_ops is not None else []
                self._enter(SubclassConstruction(self.pending_reads.mode, *region_modes))
                if self._checks_contents:
                    self._enter(self.contents)
                if self.inplace_calls.suspects is not None:
                    # fail-fast settles writes at every call: its mode stays on (`inplace_entry.py`)
                    self._enter(self.inplace_calls if self._fail_fast else self._entries)
                    self._enter(self.inplace_calls.suspects)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _saved_tensors_hooks(self) -> Any:
        """Ours, unless the program's own are on top (`saved_tensors_hooks`, `save_on_cpu` entered
        before the session): ours would replace them (other saved values, other gradients), and
        autograd checks no version of what they pack. A session's own (a nested watch) are ours."""
        top = _compat.top_saved_tensors_hooks(False)
        if top is not None and not isinstance(getattr(top[0], "__self__", None), SavedTensors):
            self.program_hooks = True
            return contextlib.nullcontext()
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._saved.unpack)

    def _watch_calls(self, measures: bool) -> None:
        """The fast tracer's IPD105/IPD106: `inplace_calls` runs as in deep mode, and a call handed an
        object a read is awaited of runs under a dispatch mode (`suspect_calls.py`)."""
        calls = self.inplace_calls
        calls.measures = measures
        calls.suspects = SuspectCalls(self._busy, calls.overwritten, calls.check_reads, self._writes.caller_reads)
        calls.suspects.returned = calls.scripted_returned
        calls.own_work = self._busy  # its snapshot's copy is no write of the program's
        self._writes.in_flag_call = lambda: calls.flag_calls > 0
        self._entries = InplaceEntries(calls)  # the mode pushed only while it has work
        returned = self.modules.on_top_level_output

        def top_level_returned(output: Any) -> None:
            returned(output)
            self._entries.sync()  # a safe point: what a call wrote into the caller's tensors is awaited now

        self.modules.on_top_level_output = top_level_returned

    def _enter(self, ctx: Any) -> None:
        """Enter one context of the run; `__exit__` leaves them in reverse order."""
        ctx.__enter__()
        self._contexts.append(ctx)

    def __exit__(self, *exc: object) -> None:
        try:
            self.settle_caught(exc[1] if len(exc) > 1 and isinstance(exc[1], BaseException) else None)
            if exc and exc[0] is None:
                self.flush()
                if self._checks_contents:
                    self.contents.checkpoint()  # changed bytes not unpacked yet: predictions
                for overwritten in self.held.unused_stale():  # held, overwritten, not used (yet)
                    self._sink(overwritten)
            elif exc and isinstance(exc[1], BaseException):
                self._raised.error_module = (id(exc[1]), self.modules.current)
        finally:
            while self._contexts:
                ctx = self._contexts.pop()
                ctx.__exit__(None, None, None)
            self._writes.clear()
            self._graph.clear()
            self._saved.pending_nodes.clear()
            self.inplace_calls.clear()
            if self._recompute is not None:
                self._recompute.clear()
            self._active = False

    def flush(self) -> None:
        """Name pending saved tensors and settle pending writes now."""
        if self._saved.pending_nodes:
            self._saved.flush_nodes()
        if self._writes.pending:
            self._writes.settle()
        if self._graph.awaiting:
            self._graph.resolve()

    # -- what the helpers may ask (`TraceOwner`) ----------------------------
    @property
    def busy(self) -> bool:
        return self._busy.on

    def emit(self, event: Event) -> None:
        """Hand an event to the sink; raise what it returns (fail-fast, or a stale tensor's error)."""
        error = self._sink(event)
        if error is None:
            return
        written = written_here(error)
        if written is not None:
            raise error from written
        raise error

    def call_raised(self, exc: BaseException, func: Any, target: Any, flag: bool = False) -> None:
        op = self._raised.call_raised(exc, func, target, flag)
        if op is not None:
            self._raised.note(exc, op, target, self.modules.current)

    def take_noted(self, exc: BaseException) -> InplaceErrorRaised | None:
        """The note of an error an in-place call raised (caught, as `settle_caught` would report it), now."""
        return self._raised.take(exc)

    def left(self, exc: BaseException) -> None:
        """`exc` left the program's code (the tool caught it itself): it is not the program's caught error."""
        self._raised.forget(exc)

    def settle_caught(self, leaving: BaseException | None = None) -> None:
        """Errors PyTorch raised at an in-place call that the program caught (all but `leaving`, the
        one leaving the watched code now), to the sink: findings the program went on after."""
        for event in self._raised.caught(leaving):
            self._sink(event)

    def user_call_returned(self) -> None:
        if self._writes.pending and not self._busy.on and self._fail_fast:
            self._writes.settle()

    # -- what the engines ask ---------------------------------------------
    @property
    def ops(self) -> int:
        """Ops the dispatch mode saw (the fast tracer: writes)."""
        return self._fast.ops if self._fast is not None else self._mode.ops

    @property
    def saves(self) -> int:
        """Tensors autograd saved."""
        return self._saved.saves

    @property
    def writes(self) -> int:
        """Ops that wrote a tensor."""
        return self._writes.writes

    def check_contents_now(self) -> None:
        """A checkpoint of the content checks (IPD109): saved tensors whose bytes changed, not yet
        read by backward, are reported as predictions now (also done when the tracer exits)."""
        if self._checks_contents:
            self.contents.checkpoint()

    def set_caller_inputs(self, labelled: list[tuple[str, torch.Tensor]], anywhere: bool = False) -> None:
        """Tensors a caller handed to the model: writes to them inside a module are reported (with
        `anywhere`, outside any too: the code of a function `audit` runs)."""
        self._writes.set_caller_inputs(labelled, anywhere)

    def progress(self) -> str:
        """How far the run got, for error messages."""
        where = ""
        ctx = self.modules.current
        if ctx is not None:
            where = f" in module {ctx[0] or '<root>'} ({ctx[2]})"
        if self.fast:  # it counts no ops but writes
            return f"after {self.writes} writes, {self.saves} saved tensors{where}"
        return f"after {self.ops} ops, {self.saves} saved tensors{where}"

    def saved_records(self, storage_ptr: int) -> list[SavedRecord]:
        """Records of the saved tensors autograd still holds on one storage, oldest first, named.

        A record holds its tensor: keep `record.place()`, not the record."""
        return self._saved.records(storage_ptr)

    def live_saved_tensors(self) -> int:
        return self._saved.live()

    def describe_exception(self, exc: BaseException) -> InplaceErrorRaised:
        """Where an exception raised inside the traced code happened (it left the code: not caught there)."""
        return self._raised.describe(exc, self.modules.current)


__all__ = ["Tracer"]
