"""The result of an audit or a watch: findings plus what was run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._compat import TORCH_VERSION
from .findings import Finding, Severity
from .printing import Printable
from .sites import ROOT_LABEL
from .verification import ModelVerified, VerifyOutcome

SCHEMA_VERSION = 3  # 2: findings carry fixes[] (edits, applicability, evidence); 3: every field of the records


@dataclass
class Report(Printable):
    """Findings of one instrumented run. `str(report)` is the text report (render/text.py)."""

    findings: list[Finding]
    target: str = ""
    mode: str = ""
    backward: bool = False
    notes: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    command: str = "audit"
    root_label: str = ROOT_LABEL
    rank: int | None = None  # torch.distributed rank of the process that ran it
    stack: int = 2  # frames shown per site in text: the innermost and its caller in other code; more with --stack
    #: `run --verify`'s verdict on each model the script ran (exit codes and `fix` decide on these)
    verify_results: list[ModelVerified] = field(default_factory=list)

    def count(self, severity: Severity) -> int:
        return sum(1 for f in self.findings if f.severity is severity)

    def failed(self, fail_on: Severity = Severity.WARNING) -> bool:
        """True when a finding at or above `fail_on` severity exists."""
        return any(f.severity.rank >= fail_on.rank for f in self.findings)

    @property
    def verified_equivalent(self) -> bool:
        """True when `run --verify` verified at least one model and every one is equivalent."""
        return bool(self.verify_results) and all(v.outcome is VerifyOutcome.EQUIVALENT for v in self.verify_results)

    @property
    def verified_different(self) -> bool:
        """True when `run --verify` found a model that computes something else than its out-of-place form."""
        return any(v.outcome is VerifyOutcome.NOT_EQUIVALENT for v in self.verify_results)

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": "inplace-doctor",
            "command": self.command,
            "torch_version": TORCH_VERSION,
            "target": self.target,
            "mode": self.mode,
            "backward": self.backward,
            "summary": {str(s): self.count(s) for s in Severity},
            "findings": [f.to_dict() for f in self.findings],
            "notes": list(self.notes),
            "stats": dict(self.stats),
            "rank": self.rank,
            "verify_results": [v.to_dict() for v in self.verify_results],
            "root_label": self.root_label,
            "stack": self.stack,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        """The report `to_dict` wrote, as records (`Report.from_dict(r.to_dict())` is `r` again):
        how a report crosses a process (`run --prove`, `fix`, distributed ranks) without loss.
        Its words (messages, fixes, notes' text) are made again from the records, not read back."""
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(f"a report of schema version {version!r}; this inplace-doctor reads {SCHEMA_VERSION}")
        return cls(
            findings=[Finding.from_dict(f) for f in data.get("findings", ())],
            target=data.get("target", ""), mode=data.get("mode", ""), backward=bool(data.get("backward")),
            notes=list(data.get("notes", ())), stats=dict(data.get("stats", {})), command=data.get("command", "audit"),
            root_label=data.get("root_label", ROOT_LABEL), rank=data.get("rank"), stack=int(data.get("stack", 2)),
            verify_results=[ModelVerified.from_dict(v) for v in data.get("verify_results", ())],
        )
