"""IPD110: a tensor in the graph changed where autograd cannot see it, then used: gradients follow its old history."""

from __future__ import annotations

import re

from ..causes import GraphHistoryCause, HistoryFacts
from ..events import ChangedGraphTensorReached, GraphTensorChangedOutsideAutograd
from ..findings import Finding, Severity
from ..sites import Site
from .fix_history import history_fixes
from .phrasing import augmented_out_of_place, tensor_desc, where, without_comment
from .registry import RuleContext, make_finding, rule

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


@rule(
    "IPD110",
    "graph-tensor-changed-outside-autograd",
    "Tensor in the graph changed outside autograd, then used",
    Severity.WARNING,
    events=(GraphTensorChangedOutsideAutograd, ChangedGraphTensorReached),
)
def graph_tensor_changed_outside_autograd(
    event: GraphTensorChangedOutsideAutograd | ChangedGraphTensorReached, ctx: RuleContext
) -> Finding | None:
    """A non-leaf tensor that requires grad is changed where autograd cannot see it, then used: its gradients follow the old history.

    What: a write through a ``.detach()`` or ``.data`` alias, or any in-place
    write under ``torch.no_grad()``/``torch.inference_mode()``, into a tensor
    that an earlier op computed with grad on (an activation, not a parameter),
    and afterwards an op with grad on uses that tensor (or a view of it). The
    finding names both lines: the write and the use. A write inside a custom
    ``autograd.Function``'s forward is that Function's business for the
    tensors it returns (their gradient goes through its own backward): the use
    is the first op that reads the changed values outside it (a temporal
    shift's residual ``out += identity``), and a Function that declares its
    write with ``ctx.mark_dirty`` is not reported.

    Why: nothing saved is overwritten (the use saves the new value), so
    PyTorch raises nothing; but the tensor's history still describes its value
    before the write. Gradients flowing back from the use through it are
    computed as if the write had not happened: masked entries get gradient as
    if unmasked, a factor the write applied is missing from the gradient.
    A prediction until backward runs through the use. Where the written
    elements are known (a mask, an index, a slice: the op's own arguments),
    the gradient reaching the tensor then decides: non-zero at a written
    element confirms it (the finding gives how many of them); exactly zero at
    every one (a ``-inf`` mask before a softmax, whose output and gradient are
    exactly 0 there) means the gradients equal those of the out-of-place
    program, and the write is counted (``predictions_harmless``) and not
    reported. A use whose graph is freed without backward (a value only
    logged) is not reported either. Severity warning: a straight-through
    estimator wants exactly this, but it should say so. Not seen: the
    gradient checked is all that reaches the tensor, including what ops that
    read it before the write send there; a gradient check is skipped (backward
    through the use confirms) where the written elements cannot be lined up
    with the tensor's (a view of another dtype) or their map would pass 2**27
    elements. A read inside the forward of the Function that wrote, with grad
    turned back on there, is taken as the use. Writes into leaves and views of
    leaves (parameter init, EMA and target-network updates,
    ``p.data.clamp_()``), into tensors that do not require grad, and writes
    after ``h = h.detach()`` are not this rule.

    Example::

        fc, head = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)
        h = fc(torch.randn(4, 8))
        h.detach()[h < 0] = 0        # IPD110: the write ...
        head(h).sum().backward()     # ... and its use: fc.weight.grad as if unmasked

    Fix: replace instead of mutating, so autograd records the change
    (``h = h.masked_fill(mask, 0)``, ``h = h * 2``, with grad on); or, if no
    gradient should flow back through ``h``'s history, cut it explicitly first
    (``h = h.detach()``, then write); for a deliberate straight-through
    estimator, ``h = h + (new - h).detach()``.

    Mode: fast and deep: ``watch(deep=False)`` serves it (every op enters Python only while a changed
    graph tensor awaits its use).
    """
    reached = event if isinstance(event, ChangedGraphTensorReached) else None
    confirmed = True if reached is not None else None
    if isinstance(event, ChangedGraphTensorReached):
        event = event.changed
    write, use = event.write, event.use
    history = f" ({event.history})" if event.history else ""
    why = (
        f"The tensor's autograd history{history} still describes its value before the write, so gradients "
        "flowing back from the use through it are computed as if the write had not happened (written entries "
        "get gradient as if unchanged; a factor the write applied is missing from the gradient). PyTorch "
        "raises nothing." + backward_showed(reached)
    )
    return make_finding(
        "IPD110",
        cause=GraphHistoryCause(event.how),
        what=(
            f"{where(write.site, ctx.root_label)} changed {tensor_desc(write.shape, write.dtype)} "
            f"{_HOW.get(event.how, 'outside autograd')}, and then {where(use, ctx.root_label)} used that tensor "
            "with grad on."
        ),
        why=why,
        fix=history_fix(write.site, event.how, event.boolean_mask),
        fixes=history_fixes(write.site, event.how, event.boolean_mask),
        mutation=write.site,
        read=use,
        confirmed=confirmed,
        facts=HistoryFacts(
            event.history or "", reached.nonzero if reached else None, reached.written if reached else None
        ),
    )


def backward_showed(reached: ChangedGraphTensorReached | None) -> str:
    """What backward showed about the write, as the end of `why`."""
    if reached is None:
        return (
            " Where the ops that follow make the written entries irrelevant (a -inf mask before softmax) the "
            "gradients are right; backward sending exactly zero gradient to every written element clears this."
        )
    if reached.nonzero is None or reached.written is None:
        return (
            " Backward ran through the use (which elements were written is not known here, so the gradient "
            "they got was not checked)."
        )
    return (
        f" Backward ran through the use and sent non-zero gradient to {reached.nonzero} of the "
        f"{reached.written} written element{'s' if reached.written != 1 else ''} (exactly zero at all of "
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
