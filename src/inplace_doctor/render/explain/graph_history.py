"""IPD110's sentences: a graph tensor changed where autograd cannot see it, then used."""

from __future__ import annotations

from ...causes import GraphHistoryCause, HistoryFacts
from ...explanations import Sentences, explains
from ...findings import Finding
from ..fix_text import cut_history
from .phrasing import said, tensor_desc, where

_HOW = {
    "detach": "through a `.detach()` alias, a write autograd does not record",
    "data": "through `.data`, a write autograd does not record",
    "no_grad": "under `torch.no_grad()`, where autograd records nothing",
    "inference_mode": "under `torch.inference_mode()`, where autograd records nothing",
}

@explains("IPD110", *GraphHistoryCause)
def graph_tensor_changed_outside_autograd(finding: Finding, root_label: str) -> Sentences:
    facts, write = finding.facts, finding.mutation
    assert isinstance(facts, HistoryFacts) and finding.read is not None
    how = str(finding.cause)
    history = f" ({facts.history})" if facts.history else ""
    why = (
        f"The tensor's autograd history{history} still describes its value before the write, so gradients "
        "flowing back from the use through it are computed as if the write had not happened (written entries "
        "get gradient as if unchanged; a factor the write applied is missing from the gradient). PyTorch "
        "raises nothing."
    )
    why += backward_showed(finding.confirmed is True, facts)
    return Sentences(
        what=(
            f"{where(write, root_label)} changed {tensor_desc(facts.shape, facts.dtype)} "
            f"{_HOW.get(how, 'outside autograd')}, and then {where(finding.read, root_label)} used that tensor "
            "with grad on."
        ),
        why=why,
        fix=history_fix(finding, root_label, how),
    )


def backward_showed(reached: bool, facts: HistoryFacts) -> str:
    """What backward showed about the write, as the end of `why`."""
    if not reached:
        return (
            " Where the ops that follow make the written entries irrelevant (a -inf mask before softmax) the "
            "gradients are right; backward sending exactly zero gradient to every written element clears this."
        )
    if facts.nonzero_gradient is None or facts.written is None:
        return (
            " Backward ran through the use (which elements were written is not known here, so the gradient "
            "they got was not checked)."
        )
    return (
        f" Backward ran through the use and sent non-zero gradient to {facts.nonzero_gradient} of the "
        f"{facts.written} written element{'s' if facts.written != 1 else ''} (exactly zero at all of "
        "them would have made the write harmless)."
    )


def history_fix(finding: Finding, root_label: str, how: str) -> str:
    """The write made a change autograd records (the records' edit, `fix_text`), or its dependency cut
    explicitly; in words where no edit was built (a write that is not alone in its `no_grad` block)."""
    records = said(finding, root_label)
    if records:
        return records
    site = finding.mutation
    if how in ("no_grad", "inference_mode"):
        block = "torch.no_grad()" if how == "no_grad" else "torch.inference_mode()"
        return (
            f"make the write at {site.location} out of place on the tensor itself (a new tensor bound to its "
            f"name) and move it out of the `{block}` block, so autograd records the change; {cut_history(None)}"
        )
    return (
        f"make the write at {site.location} out of place on the tensor itself (a new tensor bound to its name, "
        f"not a write through `.detach()`/`.data`), so autograd records the change; {cut_history(None)}"
    )
