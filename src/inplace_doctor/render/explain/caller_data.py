"""IPD106's and IPD107's sentences: data that code outside the model still holds, changed."""

from __future__ import annotations

import re

from ...causes import ArgumentFacts, CallerDataCause, HeldFacts
from ...explanations import Sentences, explains
from ...findings import Finding
from .phrasing import said, tensor_desc, unedited_write_fix, where


@explains("IPD106", CallerDataCause.CALLER_INPUT)
def caller_input_overwritten(finding: Finding, root_label: str) -> Sentences:
    facts, site = finding.facts, finding.mutation
    assert isinstance(facts, ArgumentFacts)
    what = (
        f"{where(site, root_label)} wrote into {tensor_desc(facts.shape, facts.dtype)} that is "
        f"`{facts.argument}` of the model call."
    )
    if finding.read is not None:  # an `inplace=True` asked for the write: reported at the caller's read
        what += (
            " An `inplace=True` asked for that write, but the caller still held the tensor and read "
            f"it after the call: {where(finding.read, root_label)}."
        )
    return Sentences(
        what=what,
        why=(
            f"The caller's `{facts.argument}` changes under it: any code that reads it after the call (another "
            "model, a metric, the next accumulation step) silently gets the modified values."
        ),
        fix=said(finding, root_label)  # the records' sentence says the copy at forward's top too
        or f"{unedited_write_fix(site, root_label)}, or clone the input at the top of forward (`x = x.clone()`)",
    )


@explains("IPD107", CallerDataCause.HELD_ALIAS_USED, CallerDataCause.HELD_ALIAS_OVERWRITTEN)
def held_tensor_overwritten(finding: Finding, root_label: str) -> Sentences:
    facts = finding.facts
    assert isinstance(facts, HeldFacts)
    held, handed_out, changed = facts.held, facts.handed_out, where(finding.mutation, root_label)
    if finding.cause is CallerDataCause.HELD_ALIAS_USED and finding.read is not None:
        what = (
            f"{changed} changed the memory of `{held}`, handed out at {handed_out}; "
            f"then {where(finding.read, root_label)} used it ({facts.used_how})."
        )
        why = (
            f"`{held}` is an alias of the live tensor, not a copy: what was used as a snapshot held the new "
            "values, and nothing raises."
        )
    else:
        what = (
            f"{changed} changed the memory of `{held}`, handed out at {handed_out} and "
            "still held; the watched code did not use it afterwards."
        )
        why = (
            f"`{held}` is an alias of the live tensor, not a copy: if it is meant as a snapshot, loading, saving "
            "or comparing it later uses the new values."
        )
    owner = _state_dict_owner(facts.code)
    fix = (
        f"take a real snapshot at {handed_out}: `copy.deepcopy({owner}.state_dict())` or "
        f"`{{k: v.detach().clone() for k, v in {owner}.state_dict().items()}}`"
    )
    return Sentences(what=what, why=why, fix=said(finding, root_label) or fix)


# Over the user's source line (`best = model.state_dict()`), not over any text of ours.
_STATE_DICT_CALL = re.compile(r"([A-Za-z_][\w.]*(?:\[[^\]]*\])*)\.state_dict\(\)")


def _state_dict_owner(code: str) -> str:
    """The expression whose `state_dict()` the handing-out line called (`D`, `self.net`), for the fix
    the user pastes there; `model` when the line does not show one."""
    found = _STATE_DICT_CALL.search(code)
    return found.group(1) if found else "model"
