"""Whether the intended program computes (and prints) the same twice from the same seeds.

When an edited run differs from the reference, the difference may be the program's, not the
edit's: `unrepeatable` runs the reference once more (once per reference) and, if the two
reference runs disagree (a value, or the output), says so and names what the program reads that
seeds do not fix (`proof_seeds.Unseeded`: the clock, `os.urandom`, a uuid, the network), so `fix`
calls no edit provable instead of blaming it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .produced import produced_difference

if TYPE_CHECKING:
    from .prove import Record, Run, Workspace


def unrepeatable(ws: Workspace, state: dict[str, bytes], reference: Run, repeated: dict[int, str]) -> str:
    """'' when the intended program computes the same values on a second run from the same seeds
    (the edits made the difference); else that it does not, and what it reads that seeds do not fix."""
    if id(reference) not in repeated:
        again = ws.run(state, reference=True)
        differs = _first_unequal(reference.record, again.record) if reference.record and again.record else ""
        printed = produced_difference(again, reference, "its first run")
        if printed and not differs:  # the same values, other output (a timing, a progress bar's rate)
            repeated[id(reference)] = (
                f"; but the intended program itself does not produce the same output twice from the same seeds (run "
                f"again, {printed}): {_unseeded(reference)}, so no edit can be proven equal to it")
            return repeated[id(reference)]
        repeated[id(reference)] = differs and (
            f"; but the intended program itself does not compute the same values twice from the same seeds ({differs} "
            f"differs between two runs of it): {_unseeded(reference)}, so no edit can be proven equal to it")
    return repeated[id(reference)]


def _first_unequal(a: Record, b: Record) -> str:
    """The label of the first value two records of one program disagree on; '' when they agree."""
    import itertools

    ours, theirs = a.streams(), b.streams()
    for stream in {**ours, **theirs}:
        for x, y in itertools.zip_longest(ours.get(stream, []), theirs.get(stream, [])):
            if x is None or y is None or x[:2] != y[:2]:
                return (x or y)[0]
    return "" if (a.how, a.detail) == (b.how, b.detail) else f"how it ended ({a.ended}, then {b.ended})"


_KINDS = {"clock": "the clock", "urandom": "the operating system's random bytes", "uuid": "a random uuid",
          "network": "the network"}


def _unseeded(reference: Run) -> str:
    """What the program reads that seeds do not fix, at its own lines, in words."""
    reads = reference.record.unseeded if reference.record is not None else ()
    if not reads:
        return ("something the seeds do not fix changes between runs: a file it reads, the clock or the network read "
                "inside a library, or a nondeterministic kernel (on a GPU, torch.use_deterministic_algorithms(True) "
                "makes those deterministic or raises)")
    rel = {file: os.path.relpath(file, reference.tree) for _, _, file, _ in reads}
    named = [f"{_KINDS.get(kind, kind)} ({called} at {file if rel[file].startswith('..') else rel[file]}:{line})"
             for kind, called, file, line in reads]
    return f"it reads what seeds do not fix: {', '.join(named)}"
