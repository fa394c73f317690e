"""Events in, findings out: runs the selected rules, keeps predictions until backward settles them,
and folds findings with the same cause.

A write to a tensor autograd saved is a *prediction*: backward will raise
(IPD101), or read the changed values (IPD104), only if it reaches that
tensor. The prediction is kept, not reported, until one of:

- backward reaches the tensor (`StaleSavedTensorUsed`, `SavedTensorReached`):
  the rules report it confirmed, and predictions of the same cause still
  pending (other layers' parameters written by the same `opt.step()`) fold
  into that finding;
- autograd frees the tensor unread (`SavedTensorFreed`): its graph was never
  backpropagated through that node (an RL target computed with grad and used
  detached), so nothing can happen; counted in `dropped`, never reported (not
  sent for one a backward that raised in its graph stopped before: `saved.py`);
- IPD110 only: backward sends exactly zero gradient to every position the
  write changed (`ChangedGraphTensorHarmless`): the gradients are the
  out-of-place program's; counted in `harmless`, never reported;
- the run ends (`finish`): still pending, reported unconfirmed with the
  reason. One policy for its severity: a prediction backward would have
  reached but did not, because backward (or forward) stopped at an earlier
  error first, is a warning (`Unreached.STOPPED_AT_INPLACE_ERROR`: the
  predictions in the graph of the backward that raised, `stopped_before`;
  `STOPPED_AT_ERROR`, `FORWARD_STOPPED`, `NO_BACKWARD`), wherever the
  run ended (`audit`, `watch`, a script under `run` that raised, an error the
  program caught); one with no backward run through its graph while the
  session was active is info.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..causes import Cause, SavedTensorCause, Unreached, VersionFacts
from ..errors import InplaceError, WrittenHere
from ..events import (
    BackwardErrorCaught,
    ChangedGraphTensorFreed,
    ChangedGraphTensorHarmless,
    ChangedGraphTensorReached,
    Event,
    GraphTensorChangedOutsideAutograd,
    InplaceErrorRaised,
    SavedTensorChangedOutside,
    SavedTensorFreed,
    SavedTensorOverwritten,
    SavedTensorReached,
    StaleSavedTensorUsed,
)
from ..findings import Finding, Severity
from ..sites import write_stack
from . import Rule
from .fixes.fix_sets import alternative_fixes, are_updates, fixes_of_places
from .phrasing import place_of
from .suppress import is_suppressed

# What settles a prediction (`_predicted_key` says what one is): backward reaching its tensor, or
# autograd freeing it unread. IPD110's keys are negative, never a saved tensor's.
_REACHED = (StaleSavedTensorUsed, SavedTensorReached, ChangedGraphTensorReached)
_FREED = (SavedTensorFreed, ChangedGraphTensorFreed)
_REMEMBERED_OVERWRITES = 4096
_FIXES_SHOWN = 4


class Analyzer:
    """The tracer's sink. Returns the exception the tracer should raise, if any."""

    def __init__(
        self,
        rules: Sequence[Rule],
        *,
        root_label: str = "",
        fail_fast: bool = False,
        per_module_ignores: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.root_label = root_label
        self.per_module_ignores = dict(per_module_ignores or {})
        self.suppressed = 0
        # Saved tensors whose overwrite was suppressed: PyTorch's error when backward
        # reaches them (and our confirmation of it) is part of the same suppressed finding.
        self._suppressed_saved: set[int] = set()
        self._suppressed_error = False
        self.fail_fast = fail_fast
        self.findings: list[Finding] = []
        self._index: dict[tuple[object, ...], int] = {}
        #: per folded finding, what each of its fix sentences fixes (`_fixed_by`): folding compares these, never the words
        self._fixes_said: dict[tuple[object, ...], list[tuple[object, ...]]] = {}
        self._overwrites: OrderedDict[int, SavedTensorOverwritten] = OrderedDict()
        #: saved-tensor key -> the findings predicted for it, not yet reported
        self.pending: dict[int, list[Finding]] = {}
        #: predictions whose saved tensor autograd freed without backward reading it
        self.dropped = 0
        #: IPD110 predictions whose written positions backward sent exactly zero gradient
        self.harmless = 0
        #: keys of predictions pending when a backward stopped at an error this session raised
        self._cut_short: set[int] = set()
        self._by_event: dict[type, list[Rule]] = {}
        self._contexts = {r.code: _RuleView(self, r.code) for r in rules}
        for r in rules:
            for event_type in r.events:
                self._by_event.setdefault(event_type, []).append(r)

    def wants(self, event_type: type) -> bool:
        """Whether a selected rule reads this kind of event (the tracer skips work nobody reads)."""
        return event_type in self._by_event

    def overwrite_for(self, key: int) -> SavedTensorOverwritten | None:
        """The last write that changed saved tensor `key`, if one was seen."""
        return self._overwrites.get(key)

    def __call__(self, event: Event) -> BaseException | None:
        if self._settled_without_rules(event):
            return None
        if isinstance(event, SavedTensorOverwritten):
            self._overwrites[event.saved.key] = event
            self._overwrites.move_to_end(event.saved.key)
            while len(self._overwrites) > _REMEMBERED_OVERWRITES:
                self._overwrites.popitem(last=False)
        produced = self.handle(event)
        if _predicted_key(event) is not None:
            return None  # a prediction: nothing is certain until backward reaches the tensor
        if isinstance(event, StaleSavedTensorUsed):
            return self._stale_error(event, produced)
        if self.fail_fast:
            errors = [f for f in produced if f.severity is Severity.ERROR]
            if errors:
                return self._error(errors, getattr(event, "key", None))
        return None

    def _settled_without_rules(self, event: Event) -> bool:
        """Events that only settle what is kept (an error the program caught, a saved tensor freed
        unread, an IPD110 write found harmless): True when `event` was one of them."""
        if isinstance(event, BackwardErrorCaught):  # the program went on after the error it confirmed
            for key in event.keys:
                if (index := self._index.get(key)) is not None:
                    self.findings[index] = self.findings[index].with_(caught=True)
        elif isinstance(event, _FREED):
            if self.pending.pop(event.key, None):
                self.dropped += 1
        elif isinstance(event, ChangedGraphTensorHarmless):
            if self.pending.pop(event.key, None):
                self.harmless += 1
        else:
            return False
        return True

    def _stale_error(self, event: StaleSavedTensorUsed, produced: list[Finding]) -> InplaceError | None:
        """The error for backward reaching an overwritten saved tensor, None when no finding is it."""
        stale = [f for f in produced if f.code == "IPD101"]
        if not stale:
            return None
        # raised inside backward: it stops there, before what is still pending in its graph
        cut = event.stopped_before
        self._cut_short.update(self.pending if cut is None else (key for key in self.pending if key in cut))
        error = self._error(stale, event.saved.key)
        error.in_backward = True
        return error

    def _error(self, findings: list[Finding], key: int | None) -> InplaceError:
        error = InplaceError(findings[0].message, findings)
        prior = self._overwrites.get(key) if key is not None else None
        if prior is not None and prior.write.site.stack:
            error.written_here = WrittenHere(write_stack(prior.write.site))  # type: ignore[attr-defined]
        return error

    def handle(self, event: Event) -> list[Finding]:
        """Run the rules for one event and record (or, for a write to a saved tensor, keep) what they find."""
        produced: list[Finding] = []
        # Errors PyTorch raised confirm what was found earlier; they are not new occurrences.
        confirming = isinstance(event, _REACHED) or (isinstance(event, InplaceErrorRaised) and not event.caught) or (
            isinstance(event, SavedTensorChangedOutside) and event.reached
        )
        settled: list[Finding] = []  # what was predicted for the tensor backward reached now
        if isinstance(event, _REACHED) or (isinstance(event, SavedTensorChangedOutside) and confirming):
            key = _settled_key(event)
            settled = self.pending.pop(key, [])
            if key in self._suppressed_saved:
                self._suppressed_error = isinstance(event, StaleSavedTensorUsed)
                self.suppressed += 1
                return produced
        if isinstance(event, InplaceErrorRaised) and self._suppressed_error:
            self._suppressed_error = False
            self.suppressed += 1
            return produced
        predicted_key = _predicted_key(event)
        for r in self._by_event.get(type(event), ()):
            finding = r.check(event, self._contexts[r.code])
            if finding is not None:
                produced.extend(self._kept(event, finding, confirming, predicted_key))
        if settled and any(p.code == "IPD101" for p in produced):
            produced = self._confirm_earlier_writes(settled, produced)
        return produced

    def _kept(self, event: Event, finding: Finding, confirming: bool, predicted_key: int | None) -> list[Finding]:
        """What becomes of one rule's finding: suppressed (nothing), kept as a prediction until
        backward settles it (`predicted_key`: the tensor it is about), or recorded (folding in the
        predictions it confirms)."""
        if is_suppressed(finding, self.per_module_ignores):
            self.suppressed += 1
            if predicted_key is not None:
                if len(self._suppressed_saved) > _REMEMBERED_OVERWRITES:
                    self._suppressed_saved.clear()  # bounded in long runs, like the overwrites
                self._suppressed_saved.add(predicted_key)
            return []
        finding = self._placed(finding)
        if isinstance(event, InplaceErrorRaised) and event.caught:
            finding = finding.with_(caught=True)
        if predicted_key is not None:
            # Each write that changed the tensor is kept (`p.sub_()` under no_grad, then `opt.step()`:
            # both must move); the same write again replaces its prediction.
            predicted = self.pending.setdefault(predicted_key, [])
            predicted[:] = [f for f in predicted if f.dedupe_key != finding.dedupe_key] + [finding]
            return [finding]
        recorded = self._record(finding, confirming)
        if confirming and finding.confirmed:
            recorded = self._fold_pending(recorded, getattr(event, "stopped_before", None))
        return [recorded]

    def _confirm_earlier_writes(self, settled: list[Finding], produced: list[Finding]) -> list[Finding]:
        """The rule names the last write before backward; each earlier one predicted for the same
        tensor bumped its version too (all must move for backward to run), and backward reached
        it: confirmed, at its own line. One per line (`h[:, 0] += 1` writes twice)."""
        last = next(p for p in produced if p.code == "IPD101")
        named = {(p.mutation.file, p.mutation.line) for p in produced}
        earlier = []
        for f in settled:
            if f.code == "IPD101" and (f.mutation.file, f.mutation.line) not in named:
                named.add((f.mutation.file, f.mutation.line))
                earlier.append(f)
        alternatives = alternative_fixes([*earlier, last])
        then = last.facts if isinstance(last.facts, VersionFacts) else VersionFacts()
        updates = are_updates([*earlier, last])  # parameter updates: no write can go to a copy instead
        for f in earlier:
            facts = replace(f.facts, then=then, then_at=last.mutation.location, updates=updates) if isinstance(
                f.facts, VersionFacts
            ) else VersionFacts(then=then, then_at=last.mutation.location, updates=updates)
            confirmed = f.with_(
                confirmed=True, unreached=None, fixes=alternatives or f.fixes,
                cause=SavedTensorCause.ALSO_WRITTEN, facts=facts,
            )
            produced.append(self._record(confirmed, confirming=True))
        if earlier and alternatives:
            index = self._index[last.dedupe_key]
            self.findings[index] = self.findings[index].with_(fixes=alternatives)
            produced = [self.findings[index] if p is last else p for p in produced]
        return produced

    def _placed(self, finding: Finding) -> Finding:
        place = place_of(finding, self.root_label)
        return finding.with_(places=(place,)) if place and finding.places != (place,) else finding

    def _fold_pending(self, confirmed: Finding, in_graph: frozenset[int] | None = None) -> Finding:
        """Predictions still pending with the confirmed finding's cause (the other parameters one
        `opt.step()` overwrote) fold into it: backward stopped at the first, they share its fix. Only
        those in the graph of the backward that raised (`in_graph`, when known): one in another graph
        (a first-order graph beside the double backward that raised) was not reached and may be freed."""
        key = confirmed.dedupe_key
        keys = [k for k, fs in self.pending.items() if any(f.dedupe_key == key for f in fs)]
        for saved_key in [k for k in keys if in_graph is None or k in in_graph]:
            rest = []
            for f in self.pending[saved_key]:
                if f.dedupe_key == key:
                    # One cause, one fix; a flag fix differs per module, and each is kept.
                    own = f if f.mutation.module_inplace else confirmed
                    confirmed = self._record(f.with_(confirmed=True, fixes=own.fixes), confirming=False)
                else:
                    rest.append(f)
            if rest:
                self.pending[saved_key] = rest
            else:
                del self.pending[saved_key]
        return confirmed

    def adopt(self, findings: list[Finding]) -> None:
        """Record findings another session's tracer raised inside this one
        (a graph built under an earlier watch() reaching backward here)."""
        for finding in findings:
            if finding.dedupe_key not in self._index:
                self._record(finding, confirming=True)

    def _record(self, finding: Finding, confirming: bool) -> Finding:
        key = finding.dedupe_key
        index = self._index.get(key)
        if index is None:
            self._index[key] = len(self.findings)
            self.findings.append(finding)
            return finding
        old = self.findings[index]
        if old.confirmed and finding.confirmed is False:
            return old  # backward never reached this one (a graph beside the one that raised): not an occurrence
        places = old.places + tuple(p for p in finding.places if p not in old.places)
        alternatives = old.also
        # a flag to turn off at each place folded in: one fix with an edit per place (all must change)
        records, per_place = fixes_of_places(old.fixes, finding.fixes, _FIXES_SHOWN)
        said = self._fixes_said.setdefault(key, [_fixed_by(old)])
        if _fixed_by(finding) not in said and len(alternatives) + 1 < _FIXES_SHOWN and not per_place:
            said.append(_fixed_by(finding))
            alternatives += (finding.with_(also=()),)
        if confirming and not old.confirmed:
            merged = old.with_(
                confirmed=True, severity=finding.severity, cause=finding.cause, facts=finding.facts,
                places=places, also=alternatives, unreached=None, fixes=records,
            )
        else:
            merged = old.with_(count=old.count + 1, places=places, also=alternatives, fixes=records)
        self.findings[index] = merged
        return merged

    def finish(self, reason: Unreached, severity: Severity = Severity.INFO) -> None:
        """The run is over: predictions still pending are reported at `severity`, for `reason`; those
        pending when a backward stopped at an error this session raised, as warnings for that."""
        pending, self.pending = self.pending, {}
        cut_short, self._cut_short = self._cut_short, set()
        for key, predicted in pending.items():
            stopped = key in cut_short and severity.rank < Severity.WARNING.rank
            for f in predicted:
                ended = f.with_(confirmed=False, unreached=Unreached.STOPPED_AT_INPLACE_ERROR if stopped else reason)
                self._record(ended.with_(severity=Severity.WARNING if stopped else severity), confirming=False)

    def predicted(self) -> list[Finding]:
        """The predictions still pending (no backward has reached their tensor yet), as they stand now,
        one per cause: what a report read before backward lists, never as clean."""
        by_cause: dict[tuple[object, ...], Finding] = {}
        for predicted in self.pending.values():
            for f in predicted:
                known = by_cause.get(f.dedupe_key)
                by_cause[f.dedupe_key] = known.with_(count=known.count + 1) if known else f.with_(confirmed=False, unreached=Unreached.PENDING)
        return list(by_cause.values())

    def backward_completed(self) -> None:
        """After audit's backward ran to the end: what it never reached is not on the loss's path."""
        self.finish(Unreached.NOT_ON_LOSS_PATH)

    def backward_stopped(self) -> None:
        """After audit's backward raised at a confirmed error: the rest were not reached, but may be real."""
        self.finish(Unreached.STOPPED_AT_INPLACE_ERROR, Severity.WARNING)


def _fixed_by(finding: Finding) -> tuple[object, ...]:
    """What a finding's fix changes, as data: its `Fix` records, and for a module's `inplace` flag the
    module (the same records with no edit, `set <module>.inplace = False`, differ per module). Two
    occurrences folded into one finding add a second fix only when these differ."""
    site = finding.mutation
    return (finding.fixes, site.module if site.module_inplace else None)


class _RuleView:
    """The `RuleContext` one rule gets: the session's root label and writes, and its own findings only."""

    def __init__(self, analyzer: Analyzer, code: str) -> None:
        self._analyzer = analyzer
        self._code = code

    @property
    def root_label(self) -> str:
        return self._analyzer.root_label

    def overwrite_for(self, key: int) -> SavedTensorOverwritten | None:
        return self._analyzer.overwrite_for(key)

    def earlier(self, cause: Cause) -> Finding | None:
        return next(
            (f for f in reversed(self._analyzer.findings) if f.code == self._code and f.cause == cause), None
        )


def _predicted_key(event: Event) -> int | None:
    """The key of what a prediction is about: the saved tensor (a write to it, or its bytes found changed
    before any backward read them), or a graph tensor changed outside autograd (its negative key);
    None for events that are not predictions."""
    if isinstance(event, SavedTensorOverwritten):
        return event.saved.key
    if isinstance(event, SavedTensorChangedOutside) and not event.reached:
        return event.saved.key
    if isinstance(event, GraphTensorChangedOutsideAutograd):
        return event.key
    return None


def _settled_key(
    event: StaleSavedTensorUsed | SavedTensorReached | ChangedGraphTensorReached | SavedTensorChangedOutside,
) -> int:
    """The key of the prediction a confirming event settles."""
    if isinstance(event, (StaleSavedTensorUsed, SavedTensorChangedOutside)):
        return event.saved.key
    if isinstance(event, ChangedGraphTensorReached):
        return event.changed.key
    return event.key
