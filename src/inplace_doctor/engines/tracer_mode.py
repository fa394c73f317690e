"""Which tracer a `watch` runs (issue 26): the fast one (only writes and saves enter Python) or the deep one."""

from __future__ import annotations

from ..rules import FAST_MODE_RULES, Rule, needing_deep_mode


def choose(rules: list[Rule], deep: bool, check_contents: bool) -> list[str]:
    """What turns deep mode on when `deep=False` was asked: rule codes (or `check_contents`); [] runs fast."""
    if deep:
        return []
    return needing_deep_mode(rules) or (["check_contents"] if check_contents else [])


def switched_note(because: list[str], asked: str = "watch(deep=False)") -> str:
    """The report's note when the fast tracer was asked for (`asked`: how) and deep mode ran."""
    verb = "needs" if len(because) == 1 else "need"
    return (
        f"{asked} asked for the fast tracer, but it ran in deep mode (every op through a dispatch "
        f"mode) because {', '.join(because)} {verb} it; select only {', '.join(sorted(FAST_MODE_RULES))} to run fast"
    )
