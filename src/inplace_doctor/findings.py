"""Findings: what a rule concluded, in the user's words."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any

from .sites import Site


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

    `message` reads on its own: what happened, why it matters, and the fix.
    `confirmed` is True when backward reached the overwritten tensor (and
    raised), False when a completed backward never used it, None when unknown.
    """

    code: str
    severity: Severity
    title: str
    message: str
    mutation: Site
    saved: Site | None = None
    fix: str = ""
    confirmed: bool | None = None
    read: Site | None = None  # IPD105: the op that read the overwritten object
    count: int = 1
    details: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def dedupe_key(self) -> tuple[Any, ...]:
        saved = None
        if self.saved is not None:
            saved = (self.saved.file, self.saved.line, self.saved.op, self.saved.module, self.details.get("slot"))
        read = (self.read.file, self.read.line, self.read.op) if self.read is not None else None
        # The module path too: one line that calls several modules (`for m in self.layers: h = m(h) + h`)
        # is several sites, each with its own fix; one module called many times is one site.
        return (self.code, self.mutation.file, self.mutation.line, self.mutation.op, self.mutation.module, saved, read)

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
            "mutation": self.mutation.to_dict(),
            "saved": self.saved.to_dict() if self.saved else None,
            "read": self.read.to_dict() if self.read else None,
            "details": dict(self.details),
        }
