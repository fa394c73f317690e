"""What `verify()` returns (records): whether the configured program is equivalent, and if not where
it differs and why; and `run --verify`'s verdict on each model (`ModelVerified`), as a `Report` holds it.

`str(result)` and the notebook view are render/verify_text.py's (through `printing.Printable`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .findings import Finding
from .printing import Printable


@dataclass(frozen=True)
class Difference:
    """The first tensor that differs between the configured run and the baseline.

    NaN/inf are compared by position (the same non-finite value in the same place is equal);
    `max_abs`/`max_rel` are over the elements finite in both runs, and `nonfinite` says where
    only one run has NaN/inf ("NaN in one run only at 3 elements"), empty when nowhere."""

    what: str  # "output[0]", "loss", "grad of fc.weight", "buffer bn.running_mean", "parameter fc.weight after step 2"
    max_abs: float
    max_rel: float
    nonfinite: str = ""

    def __str__(self) -> str:
        if self.nonfinite:
            return (
                f"{self.what}: {self.nonfinite}; over the finite elements max abs difference {self.max_abs:.6g}, "
                f"max relative {self.max_rel:.6g}"
            )
        return f"{self.what}: max abs difference {self.max_abs:.6g}, max relative {self.max_rel:.6g}"


class Differences(list):  # type: ignore[type-arg]
    """The differences two runs showed (a list of `Difference`), with `notes` on the tensors
    that held NaN/inf in both runs at the same places: no difference, but worth knowing."""

    def __init__(self, items: Any = ()) -> None:
        super().__init__(items)
        self.notes: list[str] = []


@dataclass(frozen=True)
class InplaceSite:
    """A place whose in-place behaviour verify can switch off: a module flag or a functional call."""

    kind: str  # "module" or "call"
    where: str  # module path ("layer1.0.relu") or "file:line" of an inplace=True call

    def __str__(self) -> str:
        return f"module {self.where} (inplace=True)" if self.kind == "module" else f"inplace=True call at {self.where}"


@dataclass
class VerifyResult(Printable):
    """`bool(result)` is True when the configured model is equivalent to its out-of-place form."""

    equivalent: bool
    differences: list[Difference] = field(default_factory=list)
    culprits: list[InplaceSite] = field(default_factory=list)
    sites: list[InplaceSite] = field(default_factory=list)
    error: str | None = None  # what the configured run raised, if it did
    findings: list[Finding] = field(default_factory=list)
    runs: int = 0

    def __bool__(self) -> bool:
        return self.equivalent

    @property
    def notes(self) -> list[str]:
        """Tensors that held NaN/inf in both runs at the same places (not differences)."""
        return list(getattr(self.differences, "notes", ()))

    @property
    def first_difference(self) -> Difference | None:
        return self.differences[0] if self.differences else None


class VerifyOutcome(enum.StrEnum):
    """What `run --verify` concluded of one model: what exit codes and `fix` decide on."""

    EQUIVALENT = "equivalent"          # computes exactly what its out-of-place form computes
    NOT_EQUIVALENT = "not-equivalent"  # differs, or the in-place configuration raised
    NOT_VERIFIED = "not-verified"      # could not be run (a copy failed, a process group, past the limit)


@dataclass(frozen=True)
class ModelVerified(Printable):
    """`run --verify`'s verdict on one top-level module the script ran (`Report.verify_results`).

    `label` names the module (`Net`), `training` the mode it was verified in, `result` what
    `verify()` returned (None when it could not run, `reason` then says why, in words).
    `str(verified)` is the report's note on it (render/verify_text.py)."""

    label: str
    outcome: VerifyOutcome
    training: bool | None = None
    result: VerifyResult | None = None
    reason: str = ""

    @classmethod
    def of(cls, label: str, training: bool, result: VerifyResult) -> ModelVerified:
        outcome = VerifyOutcome.EQUIVALENT if result.equivalent else VerifyOutcome.NOT_EQUIVALENT
        return cls(label, outcome, training, result)

    def to_dict(self) -> dict[str, Any]:
        result = self.result
        return {
            "label": self.label,
            "outcome": str(self.outcome),
            "mode": None if self.training is None else "train" if self.training else "eval",
            "differences": [
                {"what": d.what, "max_abs": d.max_abs, "max_rel": d.max_rel, "nonfinite": d.nonfinite}
                for d in (result.differences if result is not None else [])
            ],
            "culprits": [{"kind": c.kind, "where": c.where} for c in (result.culprits if result is not None else [])],
            "error": result.error if result is not None else None,
            "reason": self.reason,
            "text": str(self),
            # the rest of the record, so `from_dict` rebuilds it in another process
            "verified": result is not None,
            "sites": [{"kind": s.kind, "where": s.where} for s in (result.sites if result is not None else [])],
            "findings": [f.to_dict() for f in (result.findings if result is not None else [])],
            "runs": result.runs if result is not None else 0,
            "equivalent_notes": result.notes if result is not None else [],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelVerified:
        """The verdict `to_dict` wrote (its `text` is made again from it, not read back)."""
        mode = data.get("mode")
        result = None
        if data["verified"]:
            differences = Differences(Difference(d["what"], d["max_abs"], d["max_rel"], d.get("nonfinite", ""))
                                      for d in data.get("differences", ()))
            differences.notes = list(data.get("equivalent_notes", ()))
            result = VerifyResult(
                equivalent=data["outcome"] == VerifyOutcome.EQUIVALENT, differences=differences,
                culprits=[InplaceSite(c["kind"], c["where"]) for c in data.get("culprits", ())],
                sites=[InplaceSite(s["kind"], s["where"]) for s in data.get("sites", ())],
                error=data.get("error"), findings=[Finding.from_dict(f) for f in data.get("findings", ())],
                runs=int(data.get("runs", 0)),
            )
        return cls(data["label"], VerifyOutcome(data["outcome"]), None if mode is None else mode == "train", result,
                   data.get("reason", ""))
