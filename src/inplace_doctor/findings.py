"""Findings: what a rule concluded, in the user's words."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any

from .sites import Site, caller_frame


class Severity(enum.StrEnum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {"error": 2, "warning": 1, "info": 0}[self.value]


@dataclass(frozen=True)
class Finding:
    """One in-place hazard, with the op that overwrote and (when known) the op that saved.

    Its parts are fields (`what` happened, `why` it matters, the `fix`); `message`
    joins them into one text that reads on its own (the JSON's and the error's). A write to a tensor saved for backward is a
    prediction until backward reaches that tensor: `confirmed` is True when it
    did (and raised, or read the changed values), False when the run ended
    without it (`unconfirmed_reason` says why, and the severity is lowered),
    None for what needs no confirmation. `count` is how many occurrences were
    folded into this finding (same lines, several layers or steps); `places`
    names them (a parameter, a module path).
    """

    code: str
    severity: Severity
    title: str
    what: str
    mutation: Site
    saved: Site | None = None
    fix: str = ""
    confirmed: bool | None = None
    read: Site | None = None  # IPD105: the op that read the overwritten object
    count: int = 1
    places: tuple[str, ...] = ()
    why: str = ""
    unconfirmed_reason: str = ""
    details: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def message(self) -> str:
        """What happened, why it matters, the fix, and (for a prediction backward never reached) why
        it is unconfirmed: the text of the JSON's `message` and of an InplaceError."""
        text = f"{self.what} {self.why}" if self.what else self.why
        text += f"\nFix: {self.fix}."
        if self.unconfirmed_reason:
            text += f"\nUnconfirmed: {self.unconfirmed_reason}"
        return text

    @property
    def dedupe_key(self) -> tuple[Any, ...]:
        """Same cause: the same rule, writing line and saving (or reading) line.

        One line that writes several layers' parameters (`opt.step()`), or runs
        in several modules (`for m in self.layers: h = m(h) + h`), or in several
        steps, is one finding; its `places` list the parameters or modules. The
        saving side counts by the line in the caller's code (`d_out = D(fake)`),
        so the layers of one model's forward fold together.
        """
        saved = None
        if self.saved is not None:
            by = caller_frame(self.saved)
            saved = (by.file, by.line) if by is not None else (self.saved.file, self.saved.line)
        read = (self.read.file, self.read.line) if self.read is not None else None
        return (self.code, self.mutation.file, self.mutation.line, self.mutation.op.split(" ")[0], saved, read)

    def with_(self, **changes: Any) -> "Finding":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": str(self.severity),
            "title": self.title,
            "message": self.message,
            "fix": self.fix,
            "confirmed": self.confirmed,
            "count": self.count,
            "places": list(self.places),
            "why": self.why,
            "unconfirmed_reason": self.unconfirmed_reason,
            "mutation": self.mutation.to_dict(),
            "saved": self.saved.to_dict() if self.saved else None,
            "read": self.read.to_dict() if self.read else None,
            "details": dict(self.details),
        }

