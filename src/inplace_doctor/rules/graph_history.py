"""IPD110: a tensor in the graph changed where autograd cannot see it, then used: gradients follow its old history.

Its sentences: render/explain/graph_history.py.
"""

from __future__ import annotations

from ..causes import GraphHistoryCause, HistoryFacts
from ..events import ChangedGraphTensorReached, GraphTensorChangedOutsideAutograd
from ..findings import Finding, Severity
from .fix_history import history_fixes
from .registry import RuleContext, make_finding, rule


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
    finding names both lines: the write and the use.

    Why: nothing saved is overwritten (the use saves the new value), so
    PyTorch raises nothing; but the tensor's history still describes its value
    before the write. Gradients flowing back from the use through it are
    computed as if the write had not happened: masked entries get gradient as
    if unmasked, a factor the write applied is missing from the gradient.
    Confirmed once backward runs through the use; a use whose graph is freed
    without backward (a value only logged) is not reported. Severity warning:
    where the ops that follow make the written entries irrelevant (a ``-inf``
    mask before softmax) the gradients happen to be right, and a
    straight-through estimator wants exactly this, but it should say so.
    Writes into leaves and views of leaves (parameter init, EMA and
    target-network updates, ``p.data.clamp_()``), into tensors that do not
    require grad, and writes after ``h = h.detach()`` are not this rule.

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
    """
    confirmed: bool | None = None
    if isinstance(event, ChangedGraphTensorReached):
        event, confirmed = event.changed, True
    write = event.write
    return make_finding(
        "IPD110",
        cause=GraphHistoryCause(event.how),
        fixes=history_fixes(write.site, event.how, event.boolean_mask),
        mutation=write.site,
        read=event.use,
        confirmed=confirmed,
        facts=HistoryFacts(event.history or "", shape=write.shape, dtype=write.dtype, boolean_mask=event.boolean_mask),
        root_label=ctx.root_label,
    )
