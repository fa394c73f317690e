"""How the fixes of one finding combine: the writes confirmed together (alternatives, or updates that
all move), and the places a finding folds in (one flag fix with an edit per place)."""

from __future__ import annotations

from dataclasses import replace

from ...findings import Finding, Fix, FixKind


def alternative_fixes(writes: list[Finding]) -> tuple[Fix, ...]:
    """The fixes of several writes to one saved tensor, earliest write first, as alternatives (one
    Fix per write); empty when the writes are updates of parameters (which move, all of them)."""
    if are_updates(writes):
        return ()
    out: list[Fix] = []
    for w in writes:
        out += [x for x in w.fixes if x not in out]
    return tuple(out)


def are_updates(writes: list[Finding]) -> bool:
    """Whether the writes are parameter updates (their fixes move or recompute: none writes to a copy)."""
    return any(x.kind in (FixKind.RECOMPUTE, FixKind.MOVE_STATEMENT, FixKind.DETACH_CARRIED) for w in writes for x in w.fixes)


_PER_PLACE = (FixKind.FLAG_OFF_AT_CONSTRUCTOR, FixKind.FLAG_OFF_AT_CALL)


def fixes_of_places(old: tuple[Fix, ...], new: tuple[Fix, ...], limit: int) -> tuple[tuple[Fix, ...], bool]:
    """The fixes of a finding that folds in another place's (a second module, a second call): a flag
    to turn off there joins the flag fix of the places before as one more edit (the finding goes only
    when every place changes: `inplace-doctor fix` tries and proves them together); other fixes are
    alternatives, at most `limit`. Also whether a flag fix gained an edit."""
    out, grew = list(old), False
    for fx in new:
        if fx in out:
            continue
        at = next((i for i, o in enumerate(out) if fx.kind in _PER_PLACE and o.kind is fx.kind and o.edits), None)
        if at is not None and fx.edits:
            extra = tuple(e for e in fx.edits if e not in out[at].edits)
            if extra:
                out[at] = replace(out[at], edits=out[at].edits + extra)
                grew = True
        elif len(out) < limit:
            out.append(fx)
    return tuple(out), grew
