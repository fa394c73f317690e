"""audit's second run, to name the line that wrote a saved tensor through NumPy, DLPack or a pointer.

IPD109 sees at unpack that a saved tensor's bytes changed with no op, but not which line changed
them, unless `check_contents` caught it in the lines after the hand-out. `audit` can repeat
its run exactly: `Preserved` gives back the parameters, buffers, inputs, flags and RNG state after
the first run. So when the first run reports such a change without its line, the model runs once
more with a `LineSearch` (trace/saves/write_lines.py) that checks the changed tensors' bytes after every
line of user code, and the first run's IPD109 findings are rewritten with the line it names, or
with what kept it from naming one (the run did not repeat, or no user line changed the bytes).

Runs without such a finding never come here. The replay snapshots the bytes of the parameters and
inputs first and writes them back after, since a write that no op makes is not one `Preserved`
can see; effects outside the model (prints, files, counters) happen a second time.

`run` cannot repeat a script's step, so `StepLineSearches` looks in the steps that follow instead:
when a watched step ends having found such changes, and another watched step follows, a
`LaterStepSearch` (trace/saves/step_lines.py) checks the tensors saved at the same places after each
line of user code until each place's line is found (or the watch ends); the findings then name
the line and the step it was found on, or say why not (no later watched step, not saved again,
saved again but not changed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from ..causes import OutsideWriteCause
from ..events import SavedTensorChangedOutside, WriteLineSearch
from ..findings import Finding
from ..report import Report
from ..rules import select_rules
from ..rules.dispatch import Analyzer
from ..sites import Site
from ..trace.raised.blame import forget_frames, internal_error, passed_through, raised_by_the_tool
from ..trace.saves.fingerprint import Fingerprint
from ..trace.saves.step_lines import LaterStepSearch, place_of
from ..trace.saves.storage import storage_span
from ..trace.saves.write_lines import LineSearch
from ..trace.tracer import Tracer
from .finish import sorted_findings
from .preserve import Preserved, generators_in
from .training import default_loss

Unlocated = list[tuple[SavedTensorChangedOutside, Fingerprint]]


def name_write_lines(
    report: Report,
    unlocated: Unlocated,
    model: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    inputs: list[torch.Tensor],
    modules: list[torch.nn.Module],
    loss_fn: Callable[[Any], torch.Tensor] | None,
    backward: bool,
) -> None:
    """Replay `model(*args, **kwargs)` (and backward) once with line checks; rewrite the IPD109
    findings of `report` that have no writing line with what the replay found."""
    search = LineSearch({event.saved.key: before for event, before in unlocated})
    _replay(search, model, args, kwargs, inputs, modules, loss_fn, backward)
    amended = Analyzer(select_rules(["IPD109"]), root_label=report.root_label)
    for event, _ in unlocated:
        key = event.saved.key
        outcome = search.outcome.get(key, WriteLineSearch.NOT_SAVED_AGAIN)
        again = dataclasses.replace(event, write=search.found.get(key), search=outcome)
        for new in amended.handle(again):
            _rewrite(report, new)
    report.notes.append(replay_note(len(unlocated)))


def _replay(
    search: LineSearch,
    model: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    inputs: list[torch.Tensor],
    modules: list[torch.nn.Module],
    loss_fn: Callable[[Any], torch.Tensor] | None,
    backward: bool,
) -> None:
    """The audit's run again, watched only for the search; nothing it finds is reported."""
    analyzer = Analyzer(select_rules(["IPD109"]))
    holder = model if isinstance(model, torch.nn.Module) else torch.nn.ModuleList()  # `modules` are what it holds
    preserved = Preserved(holder, inputs, modules, generators_in((args, kwargs)))
    tracer = Tracer(analyzer, before_write=preserved.before_write, track_call_inputs=False)
    tracer.contents.search = search
    kept = _snapshot([*[p for m in modules for p in m._parameters.values() if p is not None], *inputs])
    try:
        with preserved, tracer:
            try:
                with search:
                    output = model(*args, **kwargs)
                    tracer.flush()
                    if backward:
                        loss = loss_fn(output) if loss_fn is not None else default_loss(output)
                        if isinstance(loss, torch.Tensor) and loss.requires_grad:
                            loss.backward()
                        del loss
                    del output
            except Exception as exc:  # the program's error, where the first run may have raised too
                passed_through(exc)
                if raised_by_the_tool(exc):
                    raise internal_error(exc) from exc
                for key in search.expected:  # a tensor saved again keeps what the search found of it
                    search.outcome.setdefault(key, WriteLineSearch.FAILED)
                forget_frames(exc)
    finally:
        for storage, saved in kept:
            storage.copy_(saved)  # bytes only: no version moves


def _snapshot(tensors: list[torch.Tensor]) -> list[tuple[Any, Any]]:
    """Each distinct storage under `tensors`, with a copy of its bytes."""
    kept: dict[int, tuple[Any, Any]] = {}
    with torch.no_grad():
        for t in tensors:
            span = storage_span(t)
            if span is not None and span[0] not in kept:
                storage = t.untyped_storage()
                kept[span[0]] = (storage, storage.clone())
    return list(kept.values())


def _rewrite(report: Report, new: Finding) -> None:
    """Put what the replay found into the first run's finding for the same saved tensor, which
    names no writing line (its severity and confirmation stay the first run's)."""
    for i, old in enumerate(report.findings):
        if old.code == new.code and old.saved == new.saved and old.slot == new.slot and old.cause is not OutsideWriteCause.WRITE_SEEN:
            report.findings[i] = old.with_(
                mutation=new.mutation, cause=new.cause, fixes=new.fixes, facts=new.facts
            )
            return


def replay_note(changes: int) -> str:
    """The report's note on the second run."""
    return (
        f"to find the line that wrote {'a saved tensor' if changes == 1 else f'{changes} saved tensors'} outside "
        "PyTorch (IPD109), the model ran a second time, its parameters, buffers, inputs and RNG state restored "
        "first and after, with the tensor's bytes checked after each line of your code; effects outside the "
        "model (prints, files) happened twice"
    )


#: watched steps a place's writing line is looked for in, at most, after the step that found the change:
#: each runs every line of user code under a trace function
STEPS_SEARCHED = 2

Result = tuple[SavedTensorChangedOutside, WriteLineSearch, Site | None, tuple[int, int] | None]


class StepLineSearches:
    """`run`: the IPD109 changes watched steps found without their line, looked for in the (at most
    `STEPS_SEARCHED`) watched steps that follow; one `LaterStepSearch` at a time, widened as new
    changes come; a place searched once is not searched again (what came of it stands for it).

    `contents` is the tracer's `ContentChecks` (its `unlocated` list, and its `search` slot that
    `on_pack` feeds); `step_now()` the watched step running. The step counter calls `step_ended`
    where a step ends and `end_search` before the watch ends; `amend` rewrites the report."""

    def __init__(self, contents: Any, step_now: Callable[[], int]) -> None:
        self.contents = contents
        self.unlocated: Unlocated = contents.unlocated
        self.step_now = step_now
        self.taken = 0  # changes in `unlocated` already given a search (or its absence)
        self.search: LaterStepSearch | None = None
        self.covered: list[SavedTensorChangedOutside] = []  # the changes the running search looks for
        #: place -> what its search came to (outcome, writing line, steps checked): all searches
        self.settled: dict[tuple[Any, ...], tuple[WriteLineSearch, Site | None, tuple[int, int] | None]] = {}
        self.results: list[Result] = []
        self.searched = False  # a search ran: the report says how

    def step_ended(self, step: int, another_follows: bool) -> None:
        """Watched step `step` ended: look for the new changes' lines in the steps after it, if one follows."""
        next_step = step + 1 if another_follows else None
        new = [event for event, _ in self.unlocated[self.taken :]]
        self.taken = len(self.unlocated)
        search = self.search
        if search is not None and (
            not search.running or next_step is None or next_step >= search.first_step + STEPS_SEARCHED
        ):
            self.end_search(step)
        known = [e for e in new if place_of(e.saved.site) in self.settled]
        self.results += [self._settled(e) for e in known]
        new = [e for e in new if e not in known]
        if not new:
            return
        if next_step is None:
            self.results += [(e, WriteLineSearch.NO_LATER_STEP, None, None) for e in new]
        elif self.search is None:
            self.search = LaterStepSearch(new, next_step, self.step_now)
            self.covered = new
            self.searched = True
            self.contents.search = self.search
            self.search.__enter__()
        else:
            self.search.add(new, next_step)
            self.covered += new

    def end_search(self, last_step: int | None = None) -> None:
        """Stop the running search (outside any trace call) and keep what it found for each change;
        `last_step`: the last watched step it checked (None: the one before the running one)."""
        search, covered = self.search, self.covered
        self.search, self.covered = None, []
        if search is None:
            return
        if self.contents.search is search:
            self.contents.search = None
        search.__exit__(None, None, None)
        last = last_step if last_step is not None else self.step_now() - 1
        for event in covered:
            place = place_of(event.saved.site)
            if place not in self.settled:
                outcome, site, step = search.outcome_for(event)
                steps = None if step is None else (step, step) if site is not None else (step, max(step, last))
                self.settled[place] = (outcome, site, steps)
            self.results.append(self._settled(event))

    def _settled(self, event: SavedTensorChangedOutside) -> Result:
        outcome, site, steps = self.settled[place_of(event.saved.site)]
        return event, outcome, site, steps

    def amend(self, report: Report) -> None:
        """Rewrite the IPD109 findings of `report` that have no writing line with what the searches found."""
        self.end_search()
        for event, _ in self.unlocated[self.taken :]:
            known = place_of(event.saved.site) in self.settled
            self.results.append(self._settled(event) if known else (event, WriteLineSearch.NO_LATER_STEP, None, None))
        self.taken = len(self.unlocated)
        if not self.results:
            return
        amended = Analyzer(select_rules(["IPD109"]), root_label=report.root_label)
        for event, outcome, site, steps in sorted(self.results, key=lambda r: r[1] is not WriteLineSearch.LINE):
            again = dataclasses.replace(event, write=site, search=outcome, search_steps=steps)
            for new in amended.handle(again):
                _rewrite(report, new)
        report.findings = sorted_findings(report.findings)
        if self.searched:
            report.notes.append(
                "to find the line that wrote a saved tensor outside PyTorch (IPD109), the watched steps after the one "
                "that found the change checked the bytes of the tensors saved at the same place after each line of your code"
            )
