"""IPD110: a tensor in the graph changed where autograd cannot see it, then used: gradients follow its old history.

Its sentences: render/explain/graph_history.py.
"""

from __future__ import annotations

from ..causes import GraphHistoryCause, HistoryFacts
from ..events import ChangedGraphTensorReached, GraphTensorChangedOutsideAutograd
from ..findings import Finding, Severity
from .fixes.fix_history import history_fixes
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

    Mode: fast (the default) and deep: the fast tracer serves it (every op enters Python only while a changed
    graph tensor awaits its use), a write under ``torch.inference_mode()`` included; one under an
    inference-mode guard entered otherwise (``torch._C._InferenceMode``, C++ code) only ``--deep`` sees.
    """
    reached = event if isinstance(event, ChangedGraphTensorReached) else None
    confirmed = True if reached is not None else None
    if isinstance(event, ChangedGraphTensorReached):
        event = event.changed
    write = event.write
    return make_finding(
        "IPD110",
        cause=GraphHistoryCause(event.how),
        fixes=history_fixes(write.site, event.how, event.boolean_mask),
        mutation=write.site,
        read=event.use,
        confirmed=confirmed,
        facts=HistoryFacts(
            event.history or "",
            reached.nonzero if reached else None,
            reached.written if reached else None,
            shape=write.shape,
            dtype=write.dtype,
            boolean_mask=event.boolean_mask,
        ),
        root_label=ctx.root_label,
    )
