"""IPD102: an in-place op on a leaf tensor that requires grad, as PyTorch raises it, made specific."""

from __future__ import annotations

import re

from ..causes import LeafCause
from ..events import InplaceErrorRaised
from ..findings import Finding, Severity
from .registry import RuleContext, make_finding, rule

# Over PyTorch's own error message (not over any text of ours).
_LEAF = re.compile(r"leaf variable that requires grad.*in-place", re.IGNORECASE | re.DOTALL)


@rule(
    "IPD102",
    "inplace-on-leaf",
    "In-place op on a leaf tensor that requires grad",
    Severity.ERROR,
    events=(InplaceErrorRaised,),
)
def inplace_on_leaf(event: InplaceErrorRaised, ctx: RuleContext) -> Finding | None:
    """An in-place op modifies a leaf tensor that requires grad (or a view of one).

    What: a tensor created by the user with ``requires_grad=True`` (a
    parameter, or an input you want gradients for) is modified in place
    with grad mode on.

    Why: PyTorch raises at once ("a leaf Variable that requires grad is being
    used in an in-place operation"): the gradient would have to flow into a
    value that no longer exists. Parameter updates are meant to happen under
    ``torch.no_grad()``.

    Example::

        w = torch.randn(3, requires_grad=True)
        w.add_(1)                 # IPD102

    Fix: for an update of parameters, wrap it in ``with torch.no_grad():``; to
    compute with a modified value, use the out-of-place form (``w = w + 1``)
    or modify a ``.clone()``.

    Not seen: what PyTorch does not raise. A leaf written under
    ``torch.no_grad()`` or through ``.data`` (an optimizer's update, an init)
    raises nothing and is not reported; the same error raised inside a
    checkpoint's recompute is left to IPD108, which names the side effect.

    Mode: fast (the default) and deep: the fast tracer serves it (only writes and saves enter Python).
    """
    text = str(event.error)
    if not _LEAF.search(text) or event.in_checkpoint:
        return None  # inside a checkpoint's recompute: IPD108 explains it
    cause = LeafCause.VIEW_OF_LEAF if "view of a leaf" in text.lower() else LeafCause.LEAF
    return make_finding("IPD102", cause=cause, mutation=event.site, confirmed=True, root_label=ctx.root_label)


# (pattern, short name, why, fix) for each forward-time in-place error PyTorch raises.
