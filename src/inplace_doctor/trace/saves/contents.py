"""Saved tensors whose bytes change with no op at all: memory handed out of PyTorch, then written.

`t.numpy()`, `t.__dlpack__()` (what `np.from_dlpack(t)` calls), `t.__array__()` (what
`np.asarray(t)` calls), `torch.utils.dlpack.to_dlpack(t)` and `t.data_ptr()` hand a tensor's memory
to code that writes it without the dispatcher: a NumPy `a *= 0.5`, a ctypes `memmove`, a C/CUDA
kernel. No op runs, no version moves, and backward
silently reads the new values. So:

- each hand-out is seen (the deep tracer's `TorchFunctionMode`, `HAND_OUTS`; the fast tracer's
  wrappers of those methods, `hand_outs.py`; `to_dlpack` patched here for both) and remembered
  (weakly: the handed-out tensor, its byte range, the line), and
  every saved tensor on that memory, saved before or after, is fingerprinted (`fingerprint.py`);
  with `check_all` (`watch(check_contents=True)`, `--check-contents`) every saved tensor is,
  which also catches kernels that write an input without declaring it;
- unpack compares the fingerprint: changed bytes with an unchanged version and no write the
  tracer saw is a silent write, reported confirmed (`SavedTensorChangedOutside`, reached=True);
- with `check_all`, the frame that handed the memory out, the user functions it calls (not
  NumPy's own Python: the line that called into it is named) and, once it returns, its callers
  are checked line by line while the hand-out lives, so the writing line is named: bounded to
  `LINE_BUDGET` line events (and `CALLEE_BUDGET` in called functions) after the latest
  hand-out, only while no other trace function (a
  debugger, coverage) is set, and undone when the tracer exits; without it, `audit` looks for
  the line in a second run (`write_lines.py`, engines/replay_writes.py);
- the session's end is a checkpoint: a change found there, never unpacked, is a prediction.

Fingerprints are computed with the tool's modes off and hold no tensor (their copies, of a
non-contiguous tensor, run below autograd: the fast tracer's write kernels do not see them).
"""

from __future__ import annotations

import inspect
import os
import sys
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch

from ...events import Event, SavedTensorChangedOutside, WriteLineSearch
from ...sites import Site
from ..fast.hand_outs import METHODS, HandOutMethods, to_dlpack_patches
from ..owner import Busy
from ..places.stacks import MAX_STACK, PACKAGE_DIR, TORCH_DIR, capture_stack, make_site, resolve_stack
from .fingerprint import Fingerprint, fingerprint
from .saved import SavedRecord, SavedTensors
from .storage import storage_span
from .write_lines import searched, traced_caller, traced_site

LINE_BUDGET = 200  # lines checked per hand-out, at most, in its frame and its callers
CALLEE_BUDGET = 2000  # lines checked per hand-out, at most, in the user functions those call
_PER_STORAGE = 8  # hand-outs remembered per storage
_UNLOCATED = 64  # changes without their line remembered for a replay, at most
#: torch's own Python that hands a pointer to nobody: `__dlpack__` itself, and the dispatch of overrides
_PASS_THROUGH = tuple(os.path.join(TORCH_DIR, name) for name in ("_tensor.py", "overrides.py", "utils/dlpack.py"))
#: the callables a `TorchFunctionMode` receives for the hand-outs: (the method, how findings name it)
HAND_OUTS: dict[Any, tuple[str, str]] = {getattr(torch.Tensor, n): (n, how) for n, how in METHODS.items()}


class HandOut:
    """Memory handed out of PyTorch: its storage (weakly), its byte range, how and where.

    The storage, not the tensor: `t.detach().numpy()` keeps no Python object of the tensor it was
    called on (the array's base is a new one), but torch keeps one Python object per storage, alive
    exactly as long as the memory."""

    __slots__ = ("ref", "span", "method", "how", "stack", "_site")

    def __init__(self, t: torch.Tensor, span: tuple[int, int, int], method: str, how: str, stack: Any) -> None:
        with torch._C.DisableTorchFunction():
            self.ref = weakref.ref(t.untyped_storage())
        self.span = span
        self.method = method  # what handed it out: "numpy", "__dlpack__", "to_dlpack", "data_ptr"
        self.how = how
        self.stack = stack
        self._site: Site | None = None

    def alive(self) -> bool:
        return self.ref() is not None

    def site(self) -> Site:
        if self._site is None:
            frames, api, _ = resolve_stack(self.stack, MAX_STACK)
            self._site = make_site(self.how.strip("`"), frames, api, None, "forward")
        return self._site


class ContentChecks:
    """Hand-outs by storage, the fingerprints they call for, and the checks at unpack and checkpoints."""

    def __init__(
        self, saved: SavedTensors, emit: Callable[[Event], None], check_all: bool, busy: Busy | None = None,
        wrap_methods: bool = False,
    ) -> None:
        self.saved = saved
        self.emit = emit
        self.check_all = check_all
        #: the fast tracer's hand-out wrappers (`hand_outs.py`), entered with these checks
        self.methods = HandOutMethods(self.handed_out, busy if busy is not None else Busy()) if wrap_methods else None
        self.by_storage: dict[int, list[HandOut]] = {}
        self._lines: _LineChecks | None = None
        #: function frames that were traced: their locals snapshot is dropped once outside a trace call
        self.traced: list[FrameType] = []
        #: a replay's search for the writing line (`write_lines.LineSearch`), set by the engine that replays
        self.search: Any = None
        #: changes reported without the writing line, each with the tensor's fingerprint when saved:
        #: what a replay looks for (engines/replay_writes.py)
        self.unlocated: list[tuple[SavedTensorChangedOutside, Fingerprint]] = []

    # -- lifecycle: `to_dlpack` is a module function no TorchFunctionMode sees -----------------
    def __enter__(self) -> ContentChecks:
        for patch in to_dlpack_patches():
            patch.acquire(self)
        if self.methods is not None:
            self.methods.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.methods is not None:
            self.methods.__exit__()
        for patch in to_dlpack_patches():
            patch.release(self)
        if self._lines is not None:
            self._lines.stop()
            self._lines = None
        self.forget_snapshots()
        self.by_storage.clear()

    def forget_snapshots(self) -> None:
        """Drop the locals snapshot a trace function makes a function frame keep (`frame.f_locals`,
        refreshed before and written back after each trace call): left behind, it holds the tensors
        the frame later deletes or rebinds, and their graphs. Never called inside a trace call of
        that frame (the write-back would unbind its locals); the next trace call refreshes it."""
        if not self.traced:
            return
        tracing = self._lines.frame if self._lines is not None else None
        frames, self.traced = self.traced, [f for f in self.traced if f is tracing]  # cleared again at its stop
        for frame in frames:
            frame.f_locals.clear()

    # -- hand-outs ------------------------------------------------------------------------
    def handed_out(self, t: Any, method: str, how: str) -> None:
        """`t`'s memory left PyTorch (`.numpy()`, DLPack, a raw pointer): fingerprint what is saved there."""
        if not isinstance(t, torch.Tensor) or _asked_by_torch(sys._getframe(1)):
            return
        self.forget_snapshots()
        span = storage_span(t)
        if span is None:
            return
        entries = [e for e in self.by_storage.get(span[0], ()) if e.alive()]
        same = [e for e in entries if e.span == span and e.method == method]
        if same:  # the same memory handed out again (a loop): the first hand-out stands for it
            entry = same[0]
        else:
            entry = HandOut(t, span, method, how, capture_stack())
            entries = [*entries[-(_PER_STORAGE - 1) :], entry]
        self.by_storage[span[0]] = entries
        for record in self.saved.records(span[0]):
            if _overlaps(record, span):
                self._watch(record, entry)
        if self.check_all:
            self._start_lines(entry)

    def on_pack(self, record: SavedRecord, ptr: int) -> None:
        """A new saved tensor: fingerprinted when its memory is handed out (or every one, with check_all)."""
        if self.search is not None:
            self.search.on_pack(record)
        entries = self.by_storage.get(ptr)
        if entries:
            for entry in entries:
                if entry.alive() and _overlaps(record, entry.span):
                    self._watch(record, entry)
                    return
        if self.check_all:
            record.fingerprint = record.seen = fingerprint(record.tensor)

    def _watch(self, record: SavedRecord, entry: HandOut) -> None:
        if record.fingerprint is None:
            record.fingerprint = record.seen = fingerprint(record.tensor)
        record.handout = entry

    # -- checks ---------------------------------------------------------------------------
    def on_unpack(self, record: SavedRecord, t: torch.Tensor) -> None:
        """Backward reads a fingerprinted saved tensor: changed bytes with an unchanged version and
        no write the tracer saw (IPD104's and IPD101's cases) were written outside PyTorch."""
        self.forget_snapshots()
        if record.overwritten or t._version != record.version or not record.read:
            return
        now = fingerprint(t)
        if now is None or now == record.fingerprint:
            return
        before, record.fingerprint, record.seen = record.fingerprint, now, now  # a second backward through a retained graph: once
        self.saved.settled(record.key)
        self.emit(self._event(record, reached=True, before=before))

    def checkpoint(self) -> None:
        """The session ends: fingerprinted saved tensors that changed, not yet unpacked, are predictions."""
        self.forget_snapshots()
        for bucket in list(self.saved.by_storage.values()):
            for ref in list(bucket.values()):
                record = ref()
                if record is None or record.fingerprint is None or record.overwritten or not record.read:
                    continue
                if self.saved.is_predicted(record.key):
                    continue  # reported at an earlier checkpoint
                if record.tensor._version != record.version:
                    continue
                now = fingerprint(record.tensor)
                if now is not None and now != record.fingerprint:
                    self.saved.predicted(record.key)
                    self.emit(self._event(record, reached=False, before=record.fingerprint))

    def _event(self, record: SavedRecord, reached: bool, before: Fingerprint) -> SavedTensorChangedOutside:
        entry = record.handout
        event = SavedTensorChangedOutside(
            saved=record.info(),
            handed_out=entry.site() if entry is not None else None,
            how=entry.how if entry is not None else None,
            method=entry.method if entry is not None else None,
            write=record.written_at,
            reached=reached,
            search=WriteLineSearch.HANDOUT_FRAME if self.check_all and entry is not None else WriteLineSearch.NOT_SEARCHED,
        )
        if record.written_at is None and len(self.unlocated) < _UNLOCATED:
            self.unlocated.append((event, before))
        return event

    # -- the writing line -----------------------------------------------------------------
    def _start_lines(self, entry: HandOut) -> None:
        if self._lines is None or not self._lines.running:
            if sys.gettrace() is not None:
                return  # a debugger or coverage owns tracing: leave it alone
            frame = _user_frame(sys._getframe(1))
            if frame is None:
                return
            self._lines = _LineChecks(self, frame)
        self._lines.add(entry)

    def check_line(self, entries: list[HandOut], frame: FrameType, line: int) -> None:
        """After `line` of `frame` ran: did a saved tensor on handed-out memory change?"""
        for entry in entries:
            for record in self.saved.records(entry.span[0]):
                if record.fingerprint is None or record.overwritten or record.tensor._version != record.version:
                    continue
                if not _overlaps(record, entry.span):
                    continue
                now = fingerprint(record.tensor)
                if now is not None and now != record.seen:
                    record.seen = now
                    record.written_at = traced_site(frame, line, f"write through {entry.how.strip('`')}", "forward")
                    record.handout = record.handout or entry


class _LineChecks:
    """The trace functions that check, line by line, the frame (user code) that holds a hand-out, the
    user functions it calls (NumPy's own frames left out: the line that called into them is named)
    and, once it returns, its callers: after the latest hand-out, `LINE_BUDGET` events in its frame
    and callers, `CALLEE_BUDGET` in the functions they call (then those run unchecked)."""

    def __init__(self, checks: ContentChecks, frame: FrameType) -> None:
        self.checks = checks
        self.entries: list[HandOut] = []
        self.frame: FrameType | None = frame  # the outermost frame traced: the hand-out's, then its callers
        self.at: FrameType | None = frame  # the frame whose line `self.line` is running
        self.line = frame.f_lineno
        self.left = 0
        self.callee_left = 0
        self.running = True
        self._traced(frame)
        self._calls_fn = self._calls  # one bound method: `sys.gettrace()` is compared with it
        sys.settrace(self._calls_fn)  # line events need a thread trace function

    def add(self, entry: HandOut) -> None:
        self.entries.append(entry)
        self.left = LINE_BUDGET
        self.callee_left = CALLEE_BUDGET

    def _calls(self, frame: FrameType, event: str, arg: Any) -> Any:
        """A new frame: a user function called while checking is traced too."""
        if not self.running or self.callee_left <= 0 or not searched(frame.f_code.co_filename):
            return None
        if self._check(callee=True):
            return None
        self.at, self.line = frame, frame.f_lineno
        self._traced(frame)
        return self.trace

    def trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if not self.running:
            return None
        callee = frame is not self.frame
        if event in ("line", "return") and self._check(callee):
            return None
        if callee and self.callee_left <= 0:  # the callees' budget is spent: their caller's line runs on
            frame.f_trace = None
            self.at = traced_caller(frame)
            self.line = self.at.f_lineno if self.at is not None else 0
            return None
        if event == "line":
            self.at, self.line = frame, frame.f_lineno
        elif event == "return":
            frame.f_trace = None
            if callee:  # its caller's line runs on
                self.at = traced_caller(frame)
                self.line = self.at.f_lineno if self.at is not None else 0
                return None
            caller = _user_frame(frame.f_back)
            self.frame = self.at = caller
            if caller is None:
                self.stop()
                return None
            self.line = caller.f_lineno
            self._traced(caller)
        return self.trace

    def _check(self, callee: bool) -> bool:
        """Check the line that ran since the last event; True when checking stops."""
        self.entries = [e for e in self.entries if e.alive()]
        if self.entries and self.at is not None:
            self.checks.check_line(self.entries, self.at, self.line)
        if callee:
            self.callee_left -= 1
        else:
            self.left -= 1
        if not self.entries or self.left <= 0:
            self.stop()
            return True
        return False

    def _traced(self, frame: FrameType) -> None:
        frame.f_trace = self.trace
        if frame.f_code.co_flags & inspect.CO_OPTIMIZED:  # a function: its locals get a snapshot (a module's are its globals)
            self.checks.traced.append(frame)

    def stop(self) -> None:
        if self.frame is not None:
            self.frame.f_trace = None
        self.frame = self.at = None  # frames hold the user's locals: never kept past the check
        self.entries = []
        self.running = False
        if sys.gettrace() == self._calls_fn:
            sys.settrace(None)


def _asked_by_torch(frame: FrameType | None) -> bool:
    """Whether torch's own code asked (`nn.RNNBase` compares `data_ptr()`s on every forward): it
    writes nothing through the pointer. The tool's own frames and torch's pass-through ones are skipped."""
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith(PACKAGE_DIR) or name.startswith(_PASS_THROUGH)):
            return name.startswith(TORCH_DIR)
        frame = frame.f_back
    return False


def _user_frame(frame: FrameType | None) -> FrameType | None:
    while frame is not None and not searched(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def _overlaps(record: SavedRecord, span: tuple[int, int, int]) -> bool:
    mine = record.span()
    return mine is not None and mine[0] == span[0] and mine[1] < span[2] and span[1] < mine[2]
