"""IPD109's sentences: a saved tensor's bytes written outside PyTorch, no op and no version bump."""

from __future__ import annotations

from ...causes import HandOutFacts, OutsideWriteCause, WriteLineSearch
from ...explanations import Sentences, explains
from ...findings import Finding
from ...sites import Site
from .phrasing import said, tensor_desc, where, without_comment


@explains("IPD109", *OutsideWriteCause)
def saved_tensor_changed_outside(finding: Finding, root_label: str) -> Sentences:
    facts = finding.facts
    assert isinstance(facts, HandOutFacts) and finding.saved is not None
    how = facts.how or "a hand-out of its memory"
    desc = tensor_desc(facts.shape, facts.dtype)
    saving = f"`{finding.slot}` saved for backward ({where(finding.saved, root_label)})"
    through = f" through memory handed out by {how} at {facts.handed_out}" if facts.in_source else ""
    node = facts.node or "its autograd node"
    if finding.cause is OutsideWriteCause.WRITE_SEEN:
        write = finding.mutation
        what = f"`{without_comment(write.code or '')}` at {write.location} changed the bytes of {desc}, {saving},{through}"
        if facts.search is WriteLineSearch.LINE:
            what += f" ({_found_by_replay() if facts.search_steps is None else _found_on_step(facts.search_steps[1])})"
    elif finding.cause is OutsideWriteCause.HANDED_OUT:
        what = f"The bytes of {desc}, {saving}, changed{through}, with no PyTorch op ({_line_not_named(facts.search, facts.search_steps)})"
    else:
        what = (
            f"The bytes of {desc}, {saving}, changed with no PyTorch op and no hand-out of its memory seen "
            "(a C/CUDA extension kernel that writes an input without declaring it, or a pointer taken before "
            f"the session; {_line_not_named(facts.search, facts.search_steps)})"
        )
    version = f"the saved tensor's version stayed {facts.saved_version}"
    if finding.confirmed:  # backward reached it
        why = (
            f"No op ran and no version counter moved ({version}): backward read the new values at {node} with no "
            "error, so the gradients it computed from them are silently wrong."
        )
    else:
        why = (
            f"No op ran and no version counter moved ({version}): a backward that reaches {node} will silently "
            "compute gradients from the new values. A graph freed without such a backward is harmless."
        )
    written_at = finding.mutation if finding.cause is OutsideWriteCause.WRITE_SEEN else None
    return Sentences(what=what + ".", why=why, fix=said(finding, root_label) or _fix(facts, how, written_at))


def _fix(facts: HandOutFacts, how: str, write: Site | None) -> str:
    tail = (
        "the array then owns its memory and the saved tensor keeps its values; to change the tensor itself, "
        "do it in PyTorch (`s = s * 0.5`) so autograd sees it, or after backward"
    )
    if not facts.in_source and write is not None and write.file:
        return (
            f"give the code at {write.location} a copy of the tensor (`t.detach().clone()`) to write, or declare "
            f"the kernel's write: {tail}"
        )
    if not facts.in_source:
        return (
            "find the code that writes this tensor's memory outside PyTorch (NumPy, DLPack, a pointer, an "
            "extension kernel) and give it a copy (`t.detach().clone()`), or declare the kernel's write"
        )
    return f"hand out a copy at {facts.handed_out} (`t.detach().clone()` before {how}): {tail}"


def _found_by_replay() -> str:
    return "found by running the model a second time, state restored, and checking the bytes after each line of your code"


def _found_on_step(step: int) -> str:
    return (
        f"found on watched step {step}: a script's step cannot be run again, so the watched steps after the one that "
        "first saw the change checked the bytes of the tensor saved at the same place after each line of your code, "
        "and the change recurred at this line"
    )


def _line_not_named(search: WriteLineSearch, steps: tuple[int, int] | None = None) -> str:
    """Why the writing line is not named: how it was looked for, and what kept the search from it."""
    if search is WriteLineSearch.NO_LATER_STEP or steps is not None:
        return _not_found_on_steps(search, steps)
    replay = "a second run of the model, to find the writing line,"
    reasons = {
        WriteLineSearch.NOT_SEARCHED: (
            "the writing line was not looked for: `ipd.audit(model, x)` of the model that writes runs it a second "
            "time and names the line; `check_contents=True` checks the lines after the hand-out"
        ),
        WriteLineSearch.HANDOUT_FRAME: (
            "the lines after the hand-out, in its frame, were checked and none changed the bytes: the write ran "
            "elsewhere; `ipd.audit(model, x)` of the model that writes runs it a second time and checks every line"
        ),
        WriteLineSearch.NOT_SAVED_AGAIN: f"the writing line is not named: {replay} saved no tensor at this place, "
        "so the run does not repeat",
        WriteLineSearch.OTHER_BYTES: f"the writing line is not named: {replay} saved this tensor with other bytes, "
        "so the run is not deterministic (random draws the RNG state does not cover, or state the first run changed)",
        WriteLineSearch.NO_CHANGE: f"the writing line is not named: {replay} saved the same bytes, and no line of your "
        "code changed them (the write may depend on state the first run changed, or run in another thread)",
        WriteLineSearch.BUDGET: f"the writing line is not named: {replay} ran out of its line budget before the change",
        WriteLineSearch.TRACED: "the writing line is not named: another trace function (a debugger, coverage) was "
        "active, so a second run could not check the lines",
        WriteLineSearch.FAILED: f"the writing line is not named: {replay} raised before it saved this tensor, so the run does "
        "not repeat",
    }
    return reasons.get(search, reasons[WriteLineSearch.NOT_SEARCHED])


def _not_found_on_steps(search: WriteLineSearch, steps: tuple[int, int] | None) -> str:
    """`run`: why the watched steps after the change did not name its line (`steps`: the first and last checked)."""
    first, last = steps or (0, 0)
    when = f"watched step {first}" if first == last else f"watched steps {first} to {last}"
    checked = f"in {when}, the tensors saved at this place were checked after each line of your code"
    reasons = {
        WriteLineSearch.NO_LATER_STEP: "no watched step followed the one that found the change, where the bytes would "
        "have been checked after each line of your code; watching one more step (a larger `--steps`, where the "
        "script runs one) or `--check-contents` can name it",
        WriteLineSearch.NOT_SAVED_AGAIN: f"{when}, checked line by line to find it, saved no tensor at this place "
        "(same lines, shape and dtype), so the steps do not repeat it",
        WriteLineSearch.NO_CHANGE: f"{checked}, and no line changed their bytes (the write does not happen every step, "
        "or runs in another thread)",
        WriteLineSearch.BUDGET: f"{checked}, and the checks ran out of their line budget before the change",
        WriteLineSearch.TRACED: "another trace function (a debugger, coverage) was active, so the watched steps after "
        "the change could not check the lines",
    }
    return f"the writing line is not named: {reasons.get(search, reasons[WriteLineSearch.NO_LATER_STEP])}"


def unlocated_write(finding: Finding) -> str:
    """For a write outside PyTorch whose line was not found (IPD109, handed out): how it was looked
    for, as the text report says it under the sites ("" for any other finding)."""
    facts = finding.facts
    if finding.cause is not OutsideWriteCause.HANDED_OUT or not isinstance(facts, HandOutFacts):
        return ""
    return _line_not_named(facts.search, facts.search_steps)
