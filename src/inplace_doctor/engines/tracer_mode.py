"""Which tracer a `watch` runs (issue 26): the fast one (only writes and saves enter Python) or the deep one.

`deep=None` (the default) runs the fast tracer when it serves every selected
rule, else the deep one, and the report says which rule needed it; `deep=True`
always runs the deep one; `deep=False` asks for the fast one, with the same
fall-back and a note that names what was asked. The environment variable
`INPLACE_DOCTOR_TRACER` (`fast`, `deep` or `auto`) sets what `deep=None` means,
so a CI job or a callback can switch tracers without a code change.
"""

from __future__ import annotations

import difflib
import os

from ..errors import UsageError
from ..rules import Rule, fast_mode_rules, needing_deep_mode

ENVIRONMENT = "INPLACE_DOCTOR_TRACER"
_CHOICES = {"auto": None, "fast": False, "deep": True}


def asked(deep: bool | None) -> bool | None:
    """`deep` as given, or, when None, what `INPLACE_DOCTOR_TRACER` asks for (None: auto)."""
    if deep is not None:
        return deep
    value = os.environ.get(ENVIRONMENT, "").strip().lower()
    if not value:
        return None
    if value not in _CHOICES:
        close = difflib.get_close_matches(value, list(_CHOICES), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UsageError(f"{ENVIRONMENT}={os.environ[ENVIRONMENT]!r} is not a tracer; {hint}choose one of "
                         f"{', '.join(_CHOICES)}, or unset it")
    return _CHOICES[value]


def how_asked(deep: bool | None, api: str) -> str | None:
    """How the fast tracer was asked for, for the note: `api` (`watch(deep=False)`) or the variable."""
    if deep is False:
        return api
    if asked(None) is False:
        return f"{ENVIRONMENT}=fast"
    return None


def choose(rules: list[Rule], deep: bool | None) -> list[str]:
    """The rule codes that turn deep mode on when it was not asked for (`deep` None or False); []
    runs fast, or deep when `deep=True` asked for it.

    `check_contents` does not: the fast tracer fingerprints saved tensors and checks lines after a
    hand-out as the deep one does (trace/saves/contents.py, trace/fast/hand_outs.py)."""
    if deep:
        return []
    return needing_deep_mode(rules)


def switched_note(because: list[str], asked: str | None = None) -> str:
    """The report's note when deep mode ran without being asked for: `asked` names how the fast
    tracer was asked for (`watch(deep=False)`, `--fast`), None when it was the default."""
    verb = "needs" if len(because) == 1 else "need"
    served = ", ".join(sorted(fast_mode_rules()))
    if asked is None:
        return (
            f"the deep tracer ran (every op through a dispatch mode) because {', '.join(because)} {verb} it; "
            f"the fast tracer serves {served}"
        )
    return (
        f"{asked} asked for the fast tracer, but it ran in deep mode (every op through a dispatch "
        f"mode) because {', '.join(because)} {verb} it; select only {served} to run fast"
    )
