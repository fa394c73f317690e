"""What `optimize()` returns: the `Plan`, its `Decision`s with their evidence, and the measurements.

`str(plan)` is render/plan_text.py's (through `printing.Printable`); `plan.toml()` is the
`inplace.toml` the CLI writes (read back by toml_config.py); `to_dict()` the JSON.
"""

from __future__ import annotations

import datetime
import os
import stat
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ..._compat import TORCH_VERSION
from ...errors import UsageError
from ...findings import Finding
from ...printing import Printable, fmt_bytes
from ..memory import MemoryReport
from ..verify import VerifyResult
from .toml_config import (
    HEADER_TABLE,
    apply_config,
    compress,
    read_config_text,
    toml_comment,
    toml_string,
    write_atomically,
)


@dataclass
class Decision:
    """One in-place site and what the plan does with it."""

    site: str  # module path ("layer1.0.relu"), or file:line of a functional inplace=True call
    kind: str  # "module" or "call"
    module_type: str | None
    shipped: bool
    inplace: bool  # the planned setting
    safe: bool | None  # None: the traced run never executed it
    reason: str
    saves_bytes: int | None = None  # peak reduction measured for this decision (negative: costs)
    evidence: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.inplace != self.shipped

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CheckpointSuggestion:
    """What wrapping the module that holds the most saved activations in checkpointing measures."""

    module: str
    saved_bytes: int  # saved activations its subtree holds at the peak
    peak_before: int
    peak_after: int
    time_ratio: float  # step time with checkpointing / without
    caveats: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Plan(Printable):
    """The decisions, their evidence and the measurements before and after."""

    target: str
    mode: str
    inputs: list[str]
    optimizer: str | None
    decisions: list[Decision]
    peak_shipped: int | None  # None: the shipped configuration raises
    peak_planned: int
    time_shipped: float | None
    time_planned: float
    verified: VerifyResult  # of the planned configuration
    memory_shipped: MemoryReport | None
    memory_planned: MemoryReport
    shipped_error: str | None = None
    other_findings: list[Finding] = field(default_factory=list)  # not controlled by any flag
    saved_by_module: list[tuple[str, int]] = field(default_factory=list)
    checkpoint: CheckpointSuggestion | None = None
    checkpoint_declined: str | None = None  # why no module is suggested for checkpointing
    all_paths: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    optimizer_settings: tuple[dict[str, Any], ...] = ()  # each parameter group's hyperparameters

    # -- the config ----------------------------------------------------------
    def config(self) -> dict[str, bool]:
        """Module path -> planned `inplace` flag, for every module site the run executed."""
        return {d.site: d.inplace for d in self.decisions if d.kind == "module" and d.safe is not None}

    def memory_series(self) -> list[tuple[str, MemoryReport]]:
        """(label, report) for the charts: shipped (when it runs) and planned."""
        series = [("shipped", self.memory_shipped)] if self.memory_shipped is not None else []
        return series + [("planned", self.memory_planned)]

    def largest_holders(self, top: int = 5) -> list[tuple[str, int]]:
        """Up to `top` (module path, saved-activation bytes) from `saved_by_module`, largest first,
        no entry an ancestor or descendant of another.

        A subtree's bytes include its children's, so listing `layer1` beside `layer1.0` counts the
        same activations twice. Picked greedily: each module in order of bytes, skipped when a
        module already listed contains it or is contained by it.
        """
        return disjoint_holders(self.saved_by_module, top)

    def module_groups(self) -> list[tuple[str, list[Decision]]]:
        """The module decisions as the config groups them: (glob, its decisions) where `compress`
        puts them under one glob and they agree in shipped flag, planned flag and reason, else
        (path, [decision]); in the order of the decisions, a group where its first member is."""
        modules = [d for d in self.decisions if d.kind == "module"]
        by_site = {d.site: d for d in modules}
        groups: dict[str, tuple[str, list[Decision]]] = {}  # first member -> (glob, members)
        for pattern, _, paths in compress(self.config(), self.all_paths):
            decisions = [by_site[p] for p in paths]
            if len(decisions) > 1 and len({(d.shipped, d.inplace, d.reason) for d in decisions}) == 1:
                groups[paths[0]] = (pattern, decisions)
        out: list[tuple[str, list[Decision]]] = []
        grouped: set[str] = set()
        for d in modules:
            if d.site in grouped:
                continue
            pattern, members = groups.get(d.site, (d.site, [d]))
            grouped.update(m.site for m in members)
            out.append((pattern, members))
        return out

    @property
    def never_executed(self) -> list[str]:
        return [d.site for d in self.decisions if d.kind == "module" and d.safe is None]

    def apply(self, model: torch.nn.Module) -> dict[str, bool]:
        """Set `model`'s flags as planned; returns what changed (path -> new flag)."""
        return apply_config(model, self.config(), never_executed=[])

    def toml(self) -> str:
        reasons = {d.site: d for d in self.decisions}
        lines = [
            "# inplace-doctor in-place config: which modules run in place.",
            "# Keys are module paths (fnmatch globs allowed; later entries win).",
            "# Apply with inplace_doctor.apply_config(model, path) or plan.apply(model); check with",
            "# `inplace-doctor verify SPEC --config FILE` (or audit).",
            f"# Derived {datetime.date.today().isoformat()} from one traced training step; re-derive when the",
            "# model, its inputs or its mode change.",
            toml_comment(f"# Peak memory: shipped {_bytes_or(self.peak_shipped, self.shipped_error)}, "
                         f"planned {fmt_bytes(self.peak_planned)}."),
            "",
            f"[{HEADER_TABLE}]",
            f"target = {toml_string(self.target)}",
            "inputs = [" + ", ".join(toml_string(i) for i in self.inputs) + "]",
            f"mode = {toml_string(self.mode)}",
            f"optimizer = {toml_string(self.optimizer or 'none')}",
            f"torch = {toml_string(TORCH_VERSION)}",
            *self._peak_shipped_lines(),
            f"peak-planned-bytes = {self.peak_planned}",
            f"verified = {'true' if bool(self.verified) else 'false'}",
            "never-executed = [" + ", ".join(toml_string(p) for p in self.never_executed) + "]",
            "",
            "[inplace]",
        ]
        for pattern, flag, members in compress(self.config(), self.all_paths):
            d = reasons[members[0]]
            note = d.reason if len(members) == 1 else f"{len(members)} modules: {d.reason}"
            lines.append(f"{toml_string(pattern)} = {'true' if flag else 'false'}  # {toml_comment(note)}")
        calls = [d for d in self.decisions if d.kind == "call"]
        if calls:
            lines.append("")
            lines.append("# Functional inplace=True calls (change the line itself):")
            for d in calls:
                lines.append(toml_comment(f"#   {d.site}: {'keep' if d.inplace else 'change to inplace=False'} ({d.reason})"))
        return "\n".join(lines) + "\n"

    def _peak_shipped_lines(self) -> list[str]:
        """The header's measured shipped peak; when the shipped configuration raised there is no
        measurement, so the key is left out (never a sentinel) and a comment says why."""
        if self.peak_shipped is not None:
            return [f"peak-shipped-bytes = {self.peak_shipped}"]
        return [toml_comment(f"# peak-shipped-bytes: not measured, the shipped configuration raises ({self.shipped_error})")]

    def write(self, path: str | os.PathLike[str], *, force: bool = False) -> str | None:
        """Write the config to `path`. An existing file (people edit these by hand) is replaced
        only with `force=True`; returns its previous text then (None when there was none).
        The write is atomic (a temporary file in the same folder, then a rename), so a failed
        write leaves the old file whole; a pipe or a device is written to, never read."""
        name = os.fspath(path)
        previous = None
        if os.path.exists(name):
            if not force:
                raise UsageError(f"{name!r} exists; plan.write(path, force=True) replaces it (hand edits in it are lost)")
            mode = os.stat(name).st_mode
            if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
                with open(name, "w", encoding="utf-8") as stream:  # /dev/null, a FIFO: nothing in it to read or keep
                    stream.write(self.toml())
                return None
            if not stat.S_ISREG(mode):
                what = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
                raise UsageError(f"{name!r} is {what}; plan.write needs the path of a file, e.g. inplace.toml")
            name = os.path.realpath(name)  # through a link: the link stays, its target is replaced
            previous = read_config_text(name, "config file", strict=False)
        write_atomically(name, self.toml())
        return previous

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "mode": self.mode,
            "inputs": list(self.inputs),
            "optimizer": self.optimizer,
            "optimizer_settings": [dict(g) for g in self.optimizer_settings],
            "decisions": [d.to_dict() for d in self.decisions],
            "peak_shipped": self.peak_shipped,
            "peak_planned": self.peak_planned,
            "time_shipped": self.time_shipped,
            "time_planned": self.time_planned,
            "verified": bool(self.verified),
            "shipped_error": self.shipped_error,
            "other_findings": [f.to_dict() for f in self.other_findings],
            "saved_by_module": [list(x) for x in self.saved_by_module],
            "checkpoint": self.checkpoint.to_dict() if self.checkpoint else None,
            "checkpoint_declined": self.checkpoint_declined,
            "notes": list(self.notes),
        }


def _bytes_or(n: int | None, error: str | None) -> str:
    return fmt_bytes(n) if n is not None else f"raises ({error})"


def _is_within(path: str, other: str) -> bool:
    """Whether module `path` is `other` or inside it (`layer1.0` is within `layer1`, not `layer10`)."""
    return path == other or path.startswith(other + ".")


def disjoint_holders(saved_by_module: list[tuple[str, int]], top: int = 5) -> list[tuple[str, int]]:
    """Up to `top` entries of `saved_by_module` (largest first), no entry an ancestor or
    descendant of another: picked greedily in order, skipping a module that contains, or is
    contained by, one already picked, so that no activation is counted twice."""
    picked: list[tuple[str, int]] = []
    for name, nbytes in saved_by_module:
        if len(picked) == top:
            break
        if any(_is_within(name, p) or _is_within(p, name) for p, _ in picked):
            continue
        picked.append((name, nbytes))
    return picked
