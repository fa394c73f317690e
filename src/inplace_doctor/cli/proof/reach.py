"""Whether a proof run reached the lines its verdict is about (issue 38, item 1).

Two runs that never reached the finding's line (a script that skips its training when a marker
file exists) record nothing, and two empty records are equal: a proof of nothing. A proof child
(`recorder.py`) is given groups of lines (`--reach FILE:L1,L2`: the finding's line in the
reference; the edited lines and the finding's line in a trial); `Reach` watches those files'
line events (`sys.settrace`, only frames of those files get a line tracer) and records which
groups ran at least one of their lines. Once every group has, it stops tracing.

The tool's own tracers (`trace/saves/write_lines.py`, `--check-contents`) also call `sys.settrace`:
while `Reach` is in, `sys.settrace`/`sys.gettrace` are theirs to set and read, and `Reach` calls
their trace function as well as its own, so each sees what it would alone.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

Tracer = Callable[[FrameType, str, Any], Callable[..., Any] | None]


class Reach:
    """Groups of lines, each (file, lines), and which groups ran (`reached`), by label `FILE:L1`."""

    def __init__(self, groups: list[tuple[str, frozenset[int]]]) -> None:
        self.groups = [(os.path.realpath(f), lines) for f, lines in groups]
        self.labels = [f"{f}:{min(lines)}" for f, lines in groups]
        self.reached: set[str] = set()
        self._files = {f for f, _ in self.groups}
        self._codes: dict[CodeType, str | None] = {}  # a code object -> its file, when it is one of the groups
        self._other: Any = None  # the trace function the program or the tool set (a Tracer, or None)
        self._real_settrace, self._real_gettrace = sys.settrace, sys.gettrace
        self._on = False

    def __enter__(self) -> Reach:
        if self.groups:
            self._other = sys.gettrace()
            sys.settrace = self._set_other  # type: ignore[assignment]
            sys.gettrace = self._get_other  # type: ignore[assignment]
            self._on = True
            self._real_settrace(self._call)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._on:
            self._on = False
            sys.settrace, sys.gettrace = self._real_settrace, self._real_gettrace  # type: ignore[assignment]
            self._real_settrace(self._other)

    def _set_other(self, fn: Tracer | None) -> None:
        self._other = fn

    def _get_other(self) -> Tracer | None:
        return self._other

    def _wanted(self, code: CodeType) -> str | None:
        if code not in self._codes:
            real = os.path.realpath(code.co_filename)
            self._codes[code] = real if real in self._files else None
        return self._codes[code]

    def _call(self, frame: FrameType, event: str, arg: Any) -> Tracer | None:
        other = self._other(frame, event, arg) if self._other is not None else None
        if not self._on or not self._wanted(frame.f_code):
            return other
        self._line(frame)
        mine = self._local
        return mine if other is None else _both(mine, other)

    def _local(self, frame: FrameType, event: str, arg: Any) -> Tracer | None:
        if event == "line":
            self._line(frame)
        return self._local if self._on else None

    def _line(self, frame: FrameType) -> None:
        file, line = self._wanted(frame.f_code), frame.f_lineno
        for (f, lines), label in zip(self.groups, self.labels):
            if f == file and line in lines:
                self.reached.add(label)
        if len(self.reached) == len(self.labels):
            self._stop()


def _both(mine: Tracer, other: Tracer) -> Tracer:
    """One local trace function calling two (each continues while it returns a function)."""

    def trace(frame: FrameType, event: str, arg: Any) -> Tracer | None:
        a = mine(frame, event, arg)
        b = other(frame, event, arg)
        if a is None:
            return b
        if b is None:
            return a
        return trace if (a is mine and b is other) else _both(a, b)

    return trace
