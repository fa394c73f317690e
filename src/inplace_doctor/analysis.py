"""Events in, findings out: runs the selected rules and keeps findings deduplicated."""

from __future__ import annotations

from collections import OrderedDict
from typing import Mapping, Sequence

from .errors import InplaceError
from .events import (
    Event,
    InplaceErrorRaised,
    SavedTensorOverwritten,
    StaleSavedTensorUsed,
)
from .findings import Finding, Severity
from .rules import Rule
from .suppress import is_suppressed

_REMEMBERED_OVERWRITES = 4096


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
        self._overwrites: OrderedDict[int, SavedTensorOverwritten] = OrderedDict()
        self._by_event: dict[type, list[Rule]] = {}
        for r in rules:
            for event_type in r.events:
                self._by_event.setdefault(event_type, []).append(r)

    def overwrite_for(self, key: int) -> SavedTensorOverwritten | None:
        """The last write that changed saved tensor `key`, if one was seen."""
        return self._overwrites.get(key)

    def __call__(self, event: Event) -> BaseException | None:
        if isinstance(event, SavedTensorOverwritten):
            self._overwrites[event.saved.key] = event
            self._overwrites.move_to_end(event.saved.key)
            while len(self._overwrites) > _REMEMBERED_OVERWRITES:
                self._overwrites.popitem(last=False)
        produced = self.handle(event)
        if isinstance(event, StaleSavedTensorUsed):
            stale = [f for f in produced if f.code == "IPD101"]
            return InplaceError(stale[0].message, stale) if stale else None
        if self.fail_fast:
            errors = [f for f in produced if f.severity is Severity.ERROR]
            if errors:
                return InplaceError(errors[0].message, errors)
        return None

    def handle(self, event: Event) -> list[Finding]:
        """Run the rules for one event and record what they find."""
        produced: list[Finding] = []
        # Errors PyTorch raised confirm what was found earlier; they are not new occurrences.
        confirming = isinstance(event, (StaleSavedTensorUsed, InplaceErrorRaised))
        if isinstance(event, StaleSavedTensorUsed) and event.saved.key in self._suppressed_saved:
            self._suppressed_error = True
            self.suppressed += 1
            return produced
        if isinstance(event, InplaceErrorRaised) and self._suppressed_error:
            self._suppressed_error = False
            self.suppressed += 1
            return produced
        for r in self._by_event.get(type(event), ()):
            finding = r.check(event, self)
            if finding is None:
                continue
            if is_suppressed(finding, self.per_module_ignores):
                self.suppressed += 1
                if isinstance(event, SavedTensorOverwritten):
                    if len(self._suppressed_saved) > _REMEMBERED_OVERWRITES:
                        self._suppressed_saved.clear()  # bounded in long runs, like the overwrites
                    self._suppressed_saved.add(event.saved.key)
                continue
            produced.append(self._record(finding, confirming))
        return produced

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
        if confirming:
            merged = old.with_(confirmed=True, severity=finding.severity, message=finding.message)
        else:
            merged = old.with_(count=old.count + 1)
        self.findings[index] = merged
        return merged

    def backward_completed(self) -> None:
        """After a backward that ran to the end: IPD101 findings it never reached are unconfirmed."""
        for i, f in enumerate(self.findings):
            if f.code == "IPD101" and f.confirmed is None:
                note = (
                    f"\nUnconfirmed: backward did not reach `{f.details.get('slot')}` in this run; it raises "
                    "only when a backward goes through that branch."
                )
                self.findings[i] = f.with_(confirmed=False, severity=Severity.WARNING, message=f.message + note)
