"""What `inplace-doctor fix` exits with: its own status, unless the script ends on its own with another.

Fix's own statuses are 0 (written, and the edited script reported no finding; or nothing to fix)
and 1 (findings remain, no fix proven, `--diff`). The script's own non-zero status wins over
them, as under `inplace-doctor run`, said in one line after fix's own: the status of the program
fix leaves on disk, the edited one (as it ended in the copy of the project it was checked in)
when fix wrote its edits, else the script as it is. `sys.exit(5)` is 5, an uncaught exception 1
(as python exits), a death by signal N is 128 + N (as a shell reports it: 143 for SIGTERM).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import child_exit, ended_by
from .prove import How, Run, Workspace


class Watched(Workspace):
    """A `Workspace` that keeps each trial run by the copy it ran in (`Run.tree`), so `fix` can say
    how the edited program it writes ended."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trials: dict[str, Run] = {}

    def run(self, state: Mapping[str, bytes], **options: Any) -> Run:
        done = super().run(state, **options)
        if not options.get("reference"):
            self.trials[done.tree] = done
        return done


def edited_end(ws: Watched, tree: str) -> tuple[int, str]:
    """(the exit status, how it ended in words) of the edited program in the trial that ran in
    `tree`; (0, "") when it ran to the end, or when no trial ran there."""
    trial = ws.trials.get(tree)
    if trial is None:
        return 0, ""
    record = trial.record
    if record is None:  # it died before its record was written: a signal, os._exit
        status = child_exit(trial.status)
        return (status, ended_by(trial.status)) if status else (0, "")
    if record.how is How.EXITED:
        return int(record.detail), f"exited {record.detail}"
    if record.how is How.RAISED:
        return 1, f"raised {record.detail} (exit 1, as python exits on an uncaught exception)"
    return 0, ""


def passed_on(status: int, who: str, how: str) -> str:
    """The line that says fix exits with the script's status, not its own."""
    return f"inplace-doctor: {who} {how}: fix exits {status}, the script's own status"
