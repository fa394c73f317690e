"""IPD109's sentences: a saved tensor's bytes written outside PyTorch, no op and no version bump."""

from __future__ import annotations

import re

from ...causes import HandOutFacts, OutsideWriteCause
from ...explanations import Sentences, explains
from ...findings import Finding
from .phrasing import tensor_desc, where, without_comment

# Over the user's source line, not over any text of ours. `a = t.detach().numpy()`, `arr = np.from_dlpack(t)`: the hand-out, assigned to a name
_ASSIGNED = re.compile(r"^(?P<target>[\w.]+)\s*=\s*(?P<value>.+?)\s*$")


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
    elif finding.cause is OutsideWriteCause.HANDED_OUT:
        what = (
            f"The bytes of {desc}, {saving}, changed{through}, with no PyTorch op "
            "(run with check_contents=True to find the writing line)"
        )
    else:
        what = (
            f"The bytes of {desc}, {saving}, changed with no PyTorch op and no hand-out of its memory seen "
            "(a C/CUDA extension kernel that writes an input without declaring it, or a pointer taken before "
            "the session)"
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
    return Sentences(what=what + ".", why=why, fix=_fix(facts, how))


def _fix(facts: HandOutFacts, how: str) -> str:
    tail = (
        "the array then owns its memory and the saved tensor keeps its values; to change the tensor itself, "
        "do it in PyTorch (`s = s * 0.5`) so autograd sees it, or after backward"
    )
    if not facts.in_source:
        return (
            "find the code that writes this tensor's memory outside PyTorch (NumPy, DLPack, a pointer, an "
            "extension kernel) and give it a copy (`t.detach().clone()`), or declare the kernel's write"
        )
    code = without_comment(facts.code)
    assigned = _ASSIGNED.match(code)
    if assigned and how in ("`.numpy()`", "`__dlpack__()`") and not assigned["value"].endswith(".copy()"):
        value = assigned["value"]
        return f"replace `{code}` with `{assigned['target']} = {value}.copy()` at {facts.handed_out}: {tail}"
    return f"hand out a copy at {facts.handed_out} (`t.detach().clone()` before {how}): {tail}"
