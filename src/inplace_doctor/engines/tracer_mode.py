"""Which tracer a `watch` runs (issue 26): the fast one (only writes and saves enter Python) or the deep one."""

from __future__ import annotations

from ..rules import FAST_MODE_RULES, Rule, needing_deep_mode


def choose(rules: list[Rule], deep: bool) -> list[str]:
    """The rule codes that turn deep mode on when `deep=False` was asked; [] runs fast.

    `check_contents` does not: the fast tracer fingerprints saved tensors and checks lines after a
    hand-out as the deep one does (trace/contents.py, trace/hand_outs.py)."""
    if deep:
        return []
    return needing_deep_mode(rules)


def switched_note(because: list[str], asked: str = "watch(deep=False)") -> str:
    """The report's note when the fast tracer was asked for (`asked`: how) and deep mode ran."""
    verb = "needs" if len(because) == 1 else "need"
    return (
        f"{asked} asked for the fast tracer, but it ran in deep mode (every op through a dispatch "
        f"mode) because {', '.join(because)} {verb} it; select only {', '.join(sorted(FAST_MODE_RULES))} to run fast"
    )
