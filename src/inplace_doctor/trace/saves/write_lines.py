"""The line that wrote a saved tensor outside PyTorch, found in a replay of a repeatable run.

A write through NumPy, DLPack or a pointer runs no op: IPD109 sees the changed bytes at unpack,
not when they changed. `contents.py` looks for the line only with `check_contents`, from the frame
that handed the memory out on, for a bounded number of lines. When the run can be repeated exactly (`audit` restores the
model, inputs and RNG, see engines/replay_writes.py), it runs again with a `LineSearch`: the
saved tensors found changed (by their pack order, `SavedRecord.key`) are fingerprinted at save
and again after every line of every user frame (`sys.settrace`, user files only; torch and
library frames get no line events), and the first line after which the bytes differ is named,
with the user frames that called it.

The replay proves it repeated the first run: each suspect's fingerprint at save must equal the
first run's, else the search says the run did not repeat. Nothing runs unless a first run found
a change it could not place, so runs without such a finding pay nothing. Frames are held only
while the search runs; no tensor is kept (records are held weakly).
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Mapping
from types import FrameType
from typing import Any

from ... import _compat
from ...events import WriteLineSearch as Found
from ...sites import Site
from ..places.stacks import MAX_STACK, is_user_file, make_site
from .fingerprint import Fingerprint, fingerprint
from .saved import SavedRecord

#: line events checked at most in one replay: bounds the cost of a long forward
LINE_BUDGET = 200_000
#: installed array packages whose Python is the write itself (`np.clip` -> `_methods._clip`): the
#: line named is the one that called into them
_ARRAY_PACKAGES = frozenset({"numpy", "cupy", "numba", "jax", "jaxlib"})
_SITE_MARKERS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
_searched: dict[str, bool] = {}


def searched(filename: str) -> bool:
    """Whether lines of `filename` are checked: the user's code, not torch's nor an array package's."""
    known = _searched.get(filename)
    if known is None:
        known = is_user_file(filename)
        for marker in _SITE_MARKERS:
            if known and marker in filename:
                known = filename.split(marker, 1)[1].split(os.sep, 1)[0] not in _ARRAY_PACKAGES
        _searched[filename] = known
    return known


class LineSearch:
    """Checks the saved tensors with the given pack keys after each line of user code.

    `expected` maps each suspect's key to its fingerprint at save in the first run. Use as a
    context manager around the replayed code; `ContentChecks.on_pack` calls `on_pack`."""

    def __init__(self, expected: Mapping[int, Fingerprint]) -> None:
        self.expected = dict(expected)
        self.found: dict[int, Site] = {}
        self.outcome: dict[int, Found] = {}
        self._records: dict[int, weakref.ref[SavedRecord]] = {}
        self._seen: dict[int, Fingerprint] = {}
        self._at: FrameType | None = None  # the frame whose line `self._line` is running
        self._line = 0
        self._left = LINE_BUDGET
        self._tracing = False

    # -- the replay saves a tensor ----------------------------------------------------------
    def on_pack(self, record: SavedRecord) -> None:
        want = self.expected.get(record.key)
        if want is None:
            return
        now = fingerprint(record.tensor)
        if now is None or now != want:
            self.outcome[record.key] = Found.OTHER_BYTES
            return
        record.fingerprint = record.fingerprint or now
        self._records[record.key] = weakref.ref(record)
        self.outcome[record.key] = Found.NO_CHANGE
        self._seen[record.key] = now

    # -- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> LineSearch:
        if sys.gettrace() is not None:
            for key in self.expected:
                self.outcome[key] = Found.TRACED
            return self
        self._tracing = True
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._tracing:
            self._tracing = False
            if sys.gettrace() == self._call:
                sys.settrace(None)
        self._at = None  # the frame holds the user's locals: never kept past the search
        for key in self.expected:
            self.outcome.setdefault(key, Found.NOT_SAVED_AGAIN)
        self._records.clear()

    # -- the trace functions ----------------------------------------------------------------
    def _call(self, frame: FrameType, event: str, arg: Any) -> Any:
        if not self._tracing or not searched(frame.f_code.co_filename):
            return None
        self._check()
        self._at, self._line = frame, frame.f_lineno
        return self._local

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if not self._tracing:
            return None
        self._check()  # what changed since the last event ran in the line `self._at` was on
        if event == "line":
            self._at, self._line = frame, frame.f_lineno
        elif event == "return":
            self._at = traced_caller(frame)
            self._line = self._at.f_lineno if self._at is not None else 0
        return self._local

    def _check(self) -> None:
        if not self._records:
            return
        self._left -= 1
        if self._left < 0:
            for key in self._records:
                self.outcome[key] = Found.BUDGET
            self.stop()
            return
        for key, ref in list(self._records.items()):
            record = ref()
            if record is None or record.overwritten or record.tensor._version != record.version:
                del self._records[key]  # freed, or changed by an op: no longer this search's case
                continue
            now = fingerprint(record.tensor)
            if now is None or now == self._seen.get(key):
                continue
            del self._records[key]
            if self._at is not None:
                phase = "backward" if _compat.current_autograd_node() is not None else "forward"
                self.found[key] = traced_site(self._at, self._line, "write outside PyTorch", phase)
                self.outcome[key] = Found.LINE

    def stop(self) -> None:
        self._tracing = False
        self._records.clear()
        self._at = None
        if sys.gettrace() == self._call:
            sys.settrace(None)


def traced_caller(frame: FrameType) -> FrameType | None:
    """The user frame a returning frame goes back to, when it was called inside the search (its
    current line runs on); None when the search did not start inside it (the tool's own code)."""
    caller = frame.f_back
    while caller is not None and not searched(caller.f_code.co_filename):
        caller = caller.f_back
    return caller if caller is not None and caller.f_trace is not None else None


def traced_site(frame: FrameType, line: int, op: str, phase: str) -> Site:
    """`line` of `frame`, with the user frames inside the search that called it (outermost first)."""
    frames: list[tuple[str, int, str]] = [(frame.f_code.co_filename, line, frame.f_code.co_name)]
    f = frame.f_back
    while f is not None and len(frames) < MAX_STACK:
        if searched(f.f_code.co_filename):
            if f.f_trace is None:
                break  # a frame the search did not enter: the caller of the replayed code
            frames.append((f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
        f = f.f_back
    return make_site(op, tuple(reversed(frames)), None, None, phase)
