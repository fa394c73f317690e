"""What `verify()` returns: whether the configured program is equivalent, and if not where it differs and why.

`str(result)` and the notebook view are render/verify_text.py's (through `printing.Printable`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...findings import Finding
from ...printing import Printable


@dataclass(frozen=True)
class Difference:
    """The first tensor that differs between the configured run and the baseline."""

    what: str  # "output[0]", "loss", "grad of fc.weight", "buffer bn.running_mean", "parameter fc.weight after step 2"
    max_abs: float
    max_rel: float

    def __str__(self) -> str:
        return f"{self.what}: max abs difference {self.max_abs:.6g}, max relative {self.max_rel:.6g}"


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
    def first_difference(self) -> Difference | None:
        return self.differences[0] if self.differences else None
