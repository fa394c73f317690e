"""The line that wrote a saved tensor outside PyTorch, looked for in the script's next watched steps.

`run --steps` cannot repeat a step (the script's side effects would repeat), but a training step
usually repeats itself: the next step saves a tensor at the same place and, if the write is part
of the step, writes it again. So when a step found such a change without its line, a
`LaterStepSearch` is armed for the steps that follow (`engines/replay_writes.StepLineSearches`):
each tensor saved at one of the changed tensors' places (the same user frames, shape and dtype) is
fingerprinted at save and again after every line of user code (`write_lines.LineSearch`'s trace
functions), and the first line after which its bytes differ with no op is named.

Unlike audit's replay, the step's values are new: the fingerprint at save is the step's own, not
the first run's. The frames running when the search is armed (the script's loop) are traced from
their next line on, and every frame it traced that still runs is left untraced when it ends. The
trace functions never read a frame's locals (`frame.f_locals` would make a snapshot that keeps the
tensors the frame later drops alive), and hold no frame past the search.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

from ...events import SavedTensorChangedOutside
from ...events import WriteLineSearch as Found
from ...sites import Site
from ..places.stacks import make_site
from .fingerprint import fingerprint
from .saved import SavedRecord
from .write_lines import LineSearch, searched


def place_of(site: Site) -> tuple[Any, ...]:
    """Where a tensor was saved, as the steps repeat it: the user frames (not the module call count)."""
    return (site.module, tuple((f.file, f.line) for f in site.stack))


class LaterStepSearch(LineSearch):
    """Checks tensors saved at the changed tensors' places after each line of user code.

    `changes` are the IPD109 events found without their line; `first_step` is the watched step the
    search begins on, `step_now()` the one running (what a finding says the line was found on).
    Enter it where the script's step ended (inside its `backward()` or `optimizer.step()` call);
    exit it outside any trace call."""

    def __init__(self, changes: list[SavedTensorChangedOutside], first_step: int, step_now: Callable[[], int]) -> None:
        super().__init__({})
        self.first_step = first_step
        self.step_now = step_now
        #: place -> (shape, dtype): what a later save must match
        self.places: dict[tuple[Any, ...], tuple[tuple[int, ...], str]] = {}
        self.first_steps: dict[tuple[Any, ...], int] = {}  # place -> the first watched step looking for it
        self.add(changes, first_step)
        self.packs = 0  # tensors saved while armed: none means no later step ran
        self.matched: set[tuple[Any, ...]] = set()  # places a later step saved a tensor at
        self.lines: dict[tuple[Any, ...], tuple[Site, int]] = {}  # place -> (writing line, step)
        self.other_tracer = False  # another trace function was set: nothing searched
        self._place_of_key: dict[int, tuple[Any, ...]] = {}

    def add(self, changes: list[SavedTensorChangedOutside], first_step: int) -> None:
        """More changes found without their line: their places are looked for too, from `first_step` on."""
        for event in changes:
            place = place_of(event.saved.site)
            self.places.setdefault(place, (event.saved.shape, event.saved.dtype))
            self.first_steps.setdefault(place, first_step)

    @property
    def running(self) -> bool:
        return self._tracing

    @property
    def done(self) -> bool:
        return len(self.lines) == len(self.places)

    def on_pack(self, record: SavedRecord) -> None:
        self.packs += 1
        if not self._tracing or self.done:
            return
        t = record.tensor
        shape, dtype = tuple(t.shape), str(t.dtype).removeprefix("torch.")
        if (shape, dtype) not in self.places.values():
            return
        frames, api, module, phase, _ = record.where()
        place = place_of(make_site("", frames, api, module, phase))
        if self.places.get(place) != (shape, dtype) or place in self.lines:
            return
        now = fingerprint(t)
        if now is None:
            return
        if record.fingerprint is None:  # the content checks compare at unpack too
            record.fingerprint = record.seen = now
        self.matched.add(place)
        self._place_of_key[record.key] = place
        self._records[record.key] = weakref.ref(record)
        self._seen[record.key] = now

    # -- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> LaterStepSearch:
        if sys.gettrace() is not None:
            self.other_tracer = True
            return self
        self._tracing = True
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:  # the script's running frames: traced from their next line on
            if searched(frame.f_code.co_filename):
                frame.f_trace = self._local
                if self._at is None:
                    self._at, self._line = frame, frame.f_lineno
            frame = frame.f_back
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop checking; the frames still running that it traces (no other has its trace function) are
        left untraced. No frame is held: those that returned took their trace function with them."""
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            if frame.f_trace == self._local:
                frame.f_trace = None
            frame = frame.f_back
        super().stop()

    # -- the trace functions ----------------------------------------------------------------
    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        local = super()._local(frame, event, arg)
        return local if self._tracing else None  # stopped in this call: the frame is left untraced

    def _check(self) -> None:
        super()._check()
        for key, site in list(self.found.items()):
            place = self._place_of_key.get(key)
            if place is not None and place not in self.lines:
                self.lines[place] = (site, self.step_now())
        self.found.clear()
        if self.done:
            self.stop()

    def outcome_for(self, event: SavedTensorChangedOutside) -> tuple[Found, Site | None, int | None]:
        """What the search found for one change: the line and the step it was found on, or why there
        is none and the step the search for it began on (none when no step followed)."""
        place = place_of(event.saved.site)
        if place in self.lines:
            site, step = self.lines[place]
            return Found.LINE, site, step
        first = self.first_steps.get(place, self.first_step)
        if self.other_tracer:
            return Found.TRACED, None, first
        if self._left < 0:
            return Found.BUDGET, None, first
        if not self.packs:
            return Found.NO_LATER_STEP, None, None
        if place in self.matched:
            return Found.NO_CHANGE, None, first
        return Found.NOT_SAVED_AGAIN, None, first
