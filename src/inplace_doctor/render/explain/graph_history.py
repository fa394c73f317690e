"""IPD110's sentences: a graph tensor changed where autograd cannot see it, then used."""

from __future__ import annotations

import re

from ...causes import GraphHistoryCause, HistoryFacts
from ...explanations import Sentences, explains
from ...findings import Finding
from .phrasing import augmented_out_of_place, tensor_desc, where, without_comment
from ...sites import Site

_HOW = {
    "detach": "through a `.detach()` alias, a write autograd does not record",
    "data": "through `.data`, a write autograd does not record",
    "no_grad": "under `torch.no_grad()`, where autograd records nothing",
    "inference_mode": "under `torch.inference_mode()`, where autograd records nothing",
}
# Over the user's source line (the write to rewrite), not over any text of ours.
_ALIAS = r"(?P<name>[A-Za-z_][\w.]*?)(?:\.detach\(\)|\.data)"
_ALIAS_INDEXED = re.compile(rf"^{_ALIAS}\s*\[(?P<index>.+)\]\s*=(?!=)\s*(?P<value>.+)$")
_ALIAS_CALL = re.compile(rf"^{_ALIAS}\.(?P<op>[a-z][a-z0-9_]*?)_\((?P<args>.*)\)$")
_PLAIN_INDEXED = re.compile(r"^(?P<name>[A-Za-z_][\w.]*)\s*\[(?P<index>.+)\]\s*=(?!=)\s*(?P<value>.+)$")
_PLAIN_CALL = re.compile(r"^(?P<name>[A-Za-z_][\w.]*?)\.(?P<op>[a-z][a-z0-9_]*?)_\((?P<args>.*)\)$")
_PLAIN_AUGMENTED = re.compile(r"^(?P<name>[A-Za-z_][\w.]*)\s*(?P<op>\+|-|\*|/)=\s*(?P<value>.+)$")


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
        fix=history_fix(write, how, facts.boolean_mask),
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


def history_fix(site: Site, how: str, boolean_mask: bool) -> str:
    """The write made a change autograd records; or its dependency cut explicitly."""
    code = without_comment(site.code or "")
    replacement = _replacement(code, how, boolean_mask)
    name = replacement[0] if replacement else "t"
    cut = (
        f"if no gradient should flow back through `{name}`'s history, cut it explicitly before the write "
        f"(`{name} = {name}.detach()`, then write into it); for a deliberate straight-through estimator, "
        f"write `{name} = {name} + (new - {name}).detach()`"
    )
    if replacement is None:
        grad_on = " with grad on" if how in ("no_grad", "inference_mode") else ""
        return (
            f"make the write at {site.location} out of place on the tensor itself{grad_on} (`t = t.op(...)`, "
            f"not through `.detach()`/`.data`), so autograd records it; {cut}"
        )
    _, fixed = replacement
    moved = ""
    if how in ("no_grad", "inference_mode"):
        block = "torch.no_grad()" if how == "no_grad" else "torch.inference_mode()"
        moved = f" and move it out of the `{block}` block"
    return f"replace `{code}` with `{fixed}` at {site.location}{moved}, so autograd records the change; {cut}"


def _replacement(code: str, how: str, boolean_mask: bool) -> tuple[str, str] | None:
    """(the written name, the out-of-place statement) for the write's line, when its form is plain."""
    alias = how in ("detach", "data")
    indexed = (_ALIAS_INDEXED if alias else _PLAIN_INDEXED).match(code)
    if indexed:
        name, index, value = indexed["name"], indexed["index"].strip(), indexed["value"].strip()
        if boolean_mask and "," not in index:
            return name, f"{name} = {name}.masked_fill({index}, {value})"
        return name, f"{name} = {name}.clone(); {name}[{index}] = {value}"
    call = (_ALIAS_CALL if alias else _PLAIN_CALL).match(code)
    if call and ")." not in call["args"]:
        name = call["name"]
        return name, f"{name} = {name}.{call['op']}({call['args']})"
    augmented = None if alias else _PLAIN_AUGMENTED.match(code)
    if augmented:
        name = augmented["name"]
        return name, augmented_out_of_place(name, augmented["op"], augmented["value"].strip())
    return None
