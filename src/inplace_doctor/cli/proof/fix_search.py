"""Which fixes prove out on the user's program: the rounds of checks `fix` and `run --prove` share.

Each error or warning finding's fixes with edits are tried in order, each on a
scratch copy of the project (`prove.py`), on top of the fixes accepted so far.
A fix is accepted when its trial is proven (the finding gone, nothing new, every
recorded value equal to the intended program's), or equal as far as it ran and
stopped at a finding no run had reached (the next to fix: the next round tries
that finding's fixes), or, with `unsafe`, when its finding went whatever the
values and no other fix of that finding is proven. The accepted fixes are a set: proven when the last trial is
(`Search.proven`). Every trial is kept with its verdict (`Search.tried`), so a
report can carry what was checked as each fix's `Evidence`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ...findings import Applicability, Evidence
from ...render.code_text import moved_code, one_line, without_comment
from ...render.fix_text import moved_edits, moved_lines
from ...verification import VerifyOutcome
from ..errors import CliUsageError
from .edited_lines import origins, renamed, rewritten
from .produced import did_the_work, edited_groups, finding_site, finding_sites, unprovable
from .repeat import unrepeatable

if TYPE_CHECKING:
    from ...findings import Edit, Finding, Fix
    from ...report import Report
    from .prove import Identity, Run, Verdict, Workspace
    from .source_edits import Source

# A run stops at the first in-place error backward reaches; the next one shows after it is fixed.
ROUNDS = 8


@dataclass
class Accepted:
    code: str
    where: str  # file:line of the write, as the run that found it named it
    target: Identity
    fix: Fix
    verdict: Verdict
    described: str


@dataclass(frozen=True)
class Tried:
    """One fix checked: its edits as paths of the user's project, and what its trial showed."""

    target: Identity
    fix: Fix
    verdict: Verdict
    alone: bool  # checked on the program as it is, with no other fix made first


@dataclass
class Search:
    accepted: list[Accepted]
    rejected: list[str]  # "IPD1xx at file:line: the edits: why not", in words
    tried: list[Tried]
    state: dict[str, bytes]  # absolute path in the project -> its bytes with the accepted edits
    findings: list[Finding]  # what the last accepted trial (or the first run) reported
    tree: str  # the copy those findings name files in
    reference_failed: str = ""  # how the reference run failed, in words; "" when it ran to the end
    left: list[Finding] = field(default_factory=list)
    lines: dict[str, tuple[int, ...]] = field(default_factory=dict)  # `origins` of `state`: how `left` is named

    @property
    def proven(self) -> bool:
        """The accepted fixes as a set: the last trial proven, each earlier one proven or on the way to it."""
        return bool(self.accepted) and self.accepted[-1].verdict.proven and all(
            a.verdict.proven or a.verdict.on_the_way for a in self.accepted
        )


def search(ws: Workspace, first: Run, *, unsafe: bool, say: Callable[[str], None]) -> Search:
    """The rounds of checks (module docstring), starting from the first run's findings; `say` gets
    one line per check made."""
    from .prove import identity, serious
    from .source_edits import EditError, plan

    # the findings' lines, which the intended program must run
    sites = finding_sites(serious(first.findings), lambda p: ws.rebase(p, ws.root), ws.root)
    reference = ws.run({}, reference=True, reach=sites)
    state: dict[str, bytes] = {}
    meant: dict[str, bytes] = {}  # the files of the reference run
    repeated: dict[int, str] = {}  # id of a reference run -> how a second run of it differs ("": it does not)
    known = {identity(f, ws.root) for f in serious(first.findings)}
    findings, tree = first.findings, ws.root
    out = Search([], [], [], state, findings, tree, reference_failed=_reference_failed(reference))
    tried: set[tuple[Any, ...]] = set()
    lines: dict[str, tuple[int, ...]] = {}  # the lines of `state`'s files followed back (`origins`)
    for _ in range(ROUNDS):
        for f in serious(findings):
            target = identity(f, tree, lines)
            where = where_written(f, tree)
            chosen: tuple[Accepted, dict[str, bytes], Run, set[Identity]] | None = None
            fallback: tuple[Accepted, dict[str, bytes], Run, set[Identity]] | None = None
            for fx in _candidates(f):
                edits = tuple(replace(e, path=ws.rebase(e.path, tree)) for e in fx.edits)
                key = (target, tuple((e.path, e.old, e.new) for e in edits))
                if key in tried:
                    continue
                tried.add(key)
                # the files as fix started (the copy every run starts from), the accepted edits made:
                # a file the user changes meanwhile is neither checked nor written (write_all refuses)
                now = {**{p: data for e in edits if (data := ws.original(p := os.path.realpath(e.path))) is not None},
                       **state}
                again = [e for e in edits if _already_made(e, now)]
                if again:
                    out.rejected.append(
                        f"{f.code} at {where}: its fix would insert `{one_line(again[0].new)}` at "
                        f"{where_edit(again[0], ws.root)}, where that line already stands right above and the "
                        "finding is still there: the same edit is not made twice")
                    continue
                try:
                    changes = plan(edits, ws.root, current=now)
                except EditError as e:
                    raise CliUsageError(str(e)) from None
                candidate = {**state, **{p: after for p, (_, after) in changes.items()}}
                described = describe(edits, ws.root, changes)
                say(f"inplace-doctor: checking the fix for {f.code} at {where} on a copy of the project: {described}")
                flag = f.code == "IPD105"  # the intended program is the out-of-place one: verify's
                trial = ws.run(candidate, verify=flag, reach=edited_groups(changes, ws.root))
                renames = rewritten(changes, ws.root)  # a finding on a line the edit rewrote is still the one it was
                seen = known | renamed(known, renames)
                also = frozenset(renamed({target}, renames))
                was = sum(identity(g, tree, lines) == target for g in serious(findings))
                trial_lines = origins(candidate, ws.original, ws.root)
                verdict = _judged(ws, f, tree, trial, reference, meant, repeated, target, seen, also, was, trial_lines)
                out.tried.append(Tried(target, replace(fx, edits=edits), verdict, alone=not state))
                taken = Accepted(f.code, where, target, replace(fx, edits=edits), verdict, described)
                if not (verdict.proven or verdict.on_the_way):
                    if unsafe and verdict.gone and fallback is None:  # taken only if no other fix of it proves
                        fallback = (taken, candidate, trial, seen)
                    else:
                        out.rejected.append(f"{f.code} at {where}: {described}: {why_not(verdict)}")
                    continue
                chosen = (taken, candidate, trial, seen)
                break
            if chosen is None and fallback is not None:
                chosen = fallback
            if chosen is not None:
                taken, state, trial, seen = chosen
                out.accepted.append(taken)
                findings, tree, lines = trial.findings, trial.tree, origins(state, ws.original, ws.root)
                known = seen | {identity(g, tree, lines) for g in serious(findings)}
                if f.code == "IPD105" and taken.verdict.proven:  # what is meant from here on: the flag off
                    reference, meant = ws.run(state, reference=True), state
                break
        else:  # no finding had a fix accepted this round: none will be in the next
            break
    out.state, out.findings, out.tree, out.lines = state, findings, tree, lines
    out.left = serious(findings)
    return out


def _reference_failed(reference: Run) -> str:
    """How the reference run (the program with every saved tensor copied at save) failed, in words;
    "" when it ran to the end."""
    from .prove import How

    if reference.record is not None and reference.record.refused:
        return unprovable(reference, reference, None)
    if reference.record is None or reference.record.how is not How.RAN:
        ended = reference.record.ended if reference.record is not None else "did not start"
        last = (reference.stderr.strip().splitlines() or [""])[-1]
        return (f"the script with every saved tensor copied at save (the program it means) {ended}"
                f"{f' ({last})' if last else ''}: no fix can be proven equal to it")
    return ""


def _judged(ws: Workspace, finding: Finding, tree: str, trial: Run, reference: Run, meant: dict[str, bytes],
            repeated: dict[int, str], target: Identity, seen: set[Identity], also: frozenset[Identity], was: int,
            lines: dict[str, tuple[int, ...]]) -> Verdict:
    """The verdict on one trial: an IPD105 flag change's by `run --verify` (`_verified`); any other
    fix's against the reference run, unprovable where the runs did not do the work, and where its
    values differ, whether the intended program itself computes the same twice (`unrepeatable`)."""
    if finding.code == "IPD105":  # the intended program is the out-of-place one: verify's
        return _verified(target, trial, seen, also, was, lines)
    verdict = _judge(target, trial, reference, seen, also, was, lines)
    site = finding_site(finding, lambda p: ws.rebase(p, ws.root), ws.root) if tree == ws.root else None
    did_the_work(verdict, trial, reference, site)
    if verdict.gone and not verdict.new and verdict.comparison == "differs" and not verdict.unprovable:
        verdict.first_difference += unrepeatable(ws, meant, reference, repeated)
    return verdict


def with_evidence(report: Report, found: Search, root: str) -> Report:
    """`report` with what the checks showed on the fixes it carries, matched by their edits (data):
    a fix checked on the program as it is carries that trial's `Evidence`; the accepted fixes, when
    proven as a set and each one a fix of this report, are `proven` (what `fix` would write)."""
    from dataclasses import replace as changed

    from .prove import identity

    def key(fx: Fix) -> tuple[Any, ...]:
        edits = tuple((os.path.realpath(os.path.join(root, e.path)), e.start, e.end, e.old, e.new) for e in fx.edits)
        return (fx.kind, edits)

    shown = {key(t.fix): evidence_of(t.verdict) for t in found.tried if t.alone}
    present = {key(fx) for f in report.findings for fx in f.fixes}
    accepted = {key(a.fix): a for a in found.accepted}
    remaining = {identity(g, found.tree, found.lines) for g in found.left}
    proven: dict[tuple[Any, ...], Evidence] = {}
    if found.proven and set(accepted) <= present:
        steps = found.accepted[-1].verdict.steps
        for k, a in accepted.items():
            if a.target not in remaining:
                proven[k] = Evidence(checked=True, equal=True, finding_gone=True, steps=steps)

    def marked(fx: Fix) -> Fix:
        k = key(fx)
        if k in proven:
            return changed(fx, applicability=Applicability.PROVEN, evidence=proven[k])
        return changed(fx, evidence=shown[k]) if k in shown else fx

    findings = [f.with_(fixes=tuple(marked(fx) for fx in f.fixes)) for f in report.findings]
    return changed(report, findings=findings)


def evidence_of(v: Verdict) -> Evidence:
    """A trial's verdict as the record a report carries."""
    return Evidence(checked=True, equal=v.comparison == "equal", finding_gone=v.gone,
                    new_findings=tuple(i.code for i in v.new), steps=v.steps,
                    first_difference=v.first_difference)


def _candidates(finding: Finding) -> list[Fix]:
    return [fx for fx in finding.fixes if fx.edits and fx.applicability is not Applicability.MANUAL]


def _already_made(edit: Edit, state: dict[str, bytes]) -> bool:
    from .source_edits import Source, already_made

    path = os.path.realpath(edit.path)
    try:
        source = Source.of(state[path], path) if path in state else Source.read(path)
    except OSError:
        return False
    return already_made(edit, source)


def where_edit(edit: Edit, root: str) -> str:
    return f"{os.path.relpath(edit.path, root) if os.path.isabs(edit.path) else edit.path}:{edit.start.line}"


def _judge(target: Identity, trial: Run, reference: Run, known: set[Identity], also: frozenset[Identity],
           was: int, lines: dict[str, tuple[int, ...]]) -> Verdict:
    from .prove import How, Record, judge

    return judge(target, trial, reference.record or Record(How.NOT_STARTED, "", 0, ()), known, also=also, was=was,
                 lines=lines)


def _verified(target: Identity, trial: Run, known: set[Identity], also: frozenset[Identity],
              was: int, lines: dict[str, tuple[int, ...]]) -> Verdict:
    """An IPD105 flag change judged by `run --verify`: every model the edited script ran computes
    what its out-of-place form computes."""
    from .prove import How, Record, Verdict, judge

    # for gone and new; the record is not the measure here
    verdict = judge(target, trial, Record(How.NOT_STARTED, "", 0, ()), known, also=also, was=was, lines=lines)
    outcomes = [v.outcome for v in trial.report.verify_results] if trial.report is not None else []
    ok = bool(outcomes) and all(o is VerifyOutcome.EQUIVALENT for o in outcomes) and verdict.gone
    return Verdict(verdict.gone, verdict.new, "equal" if ok else "differs",
                   "" if ok else ("no model ran while the script was watched" if not outcomes
                                  else "verify did not find every model equivalent to its out-of-place form"),
                   trial.record.steps if trial.record is not None else 0)




def why_not(v: Verdict) -> str:
    if v.unprovable:
        return v.unprovable
    if not v.gone:
        return "the edited program still has the finding"
    if v.new:
        return f"the edited program reports {', '.join(f'{i.code} at {i.path}: {i.text}' for i in v.new)}"
    return f"not equal to the intended program: {v.first_difference}"


def describe(edits: tuple[Edit, ...], root: str, changes: dict[str, tuple[bytes, bytes]]) -> str:
    """The edits in words: a change inside one line shows the whole line before and after."""
    from .source_edits import Source

    moved = moved_edits(edits)
    if moved is not None:
        delete, insert = moved
        first, last = moved_lines(delete)
        span = where_edit(replace(delete, start=replace(delete.start, line=first)), root) + (f"-{last}" if last > first else "")
        side = "after" if insert.new.startswith(("\n", "\r")) else "before"  # the file's own line ending
        return f"move {moved_code(delete.old)} ({span}) to {side} line {insert.start.line}"
    parts = []
    for e in edits:
        where = where_edit(e, root)
        old, new = one_line(e.old), one_line(e.new)
        before_after = changes.get(os.path.realpath(e.path))
        if e.start.line == e.end.line and "\n" not in e.new and "\r" not in e.new and old and before_after is not None:
            lines = [Source.of(data, e.path) for data in before_after]
            old, new = (_line(src, e.start.line) for src in lines)
        if not old:
            parts.append(f"insert `{new}` at {where}")
        elif not new:
            parts.append(f"delete `{old}` at {where}")
        else:
            parts.append(f"replace `{old}` with `{new}` at {where}")
    return "; ".join(parts)


def _line(source: Source, number: int) -> str:
    starts = source.line_starts()
    end = starts[number] if number < len(starts) else len(source.data)
    return without_comment(source.data[starts[number - 1] : end].decode(source.encoding, "replace").strip())


def where_written(finding: Finding, tree: str) -> str:
    file = finding.mutation.file or "?"
    return f"{os.path.relpath(file, tree) if os.path.isabs(file) else file}:{finding.mutation.line}"
