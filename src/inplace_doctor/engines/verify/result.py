"""What `verify()` returns: whether the configured program is equivalent, and if not where it differs and why.

`str(result)` and the notebook view are render/verify_text.py's (through `printing.Printable`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...findings import Finding
from ...printing import Printable


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
