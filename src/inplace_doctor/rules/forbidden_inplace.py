"""IPD103: the in-place errors PyTorch raises at the op itself, made specific.

PyTorch's wording changes between releases, so each case is matched loosely. The patterns read
PyTorch's own error messages, never a text of ours: what the rule decides is a `ForbiddenCause`
(its sentences: render/explain/forbidden_inplace.py).
"""

from __future__ import annotations

import re

from ..causes import ForbiddenCause, RaisedFacts, SiteRole
from ..events import InplaceErrorRaised
from ..findings import Finding, Severity
from .fixes.fix_builders import write_fixes
from .registry import RuleContext, make_finding, rule

# The patterns read PyTorch's own error messages; the sentences of each cause are render/explain/'s.
_FORWARD_ERRORS: tuple[tuple[ForbiddenCause, re.Pattern[str]], ...] = (
    (
        ForbiddenCause.EXPANDED,
        re.compile(r"more than one element of the written-to tensor refers to a single memory location", re.I),
    ),
    (ForbiddenCause.HOOKED_OUTPUT, re.compile(r"BackwardHookFunction", re.I)),
    (ForbiddenCause.MULTIPLE_VIEWS, re.compile(r"function that returns multiple views", re.I)),
    (
        # Not "Inference tensors cannot be saved for backward": no in-place op there (an input or
        # tensor made under inference_mode reached autograd), so the model's error, not this rule.
        ForbiddenCause.NO_GRAD_VIEW,
        re.compile(r"view was created in (?:no_grad|inference) mode", re.I),
    ),
    (
        ForbiddenCause.CUSTOM_FUNCTION_VIEW,
        re.compile(r"view (?:was )?created inside a custom Function|is a view and (?:is being|its base)", re.I),
    ),
)


@rule(
    "IPD103",
    "forbidden-inplace",
    "In-place op that PyTorch forbids on this tensor",
    Severity.ERROR,
    events=(InplaceErrorRaised,),
)
def forbidden_inplace(event: InplaceErrorRaised, ctx: RuleContext) -> Finding | None:
    """An in-place op PyTorch refuses at the op: overlapping memory, multi-output views, no_grad views, hooked outputs.

    What: one of the in-place errors PyTorch raises during forward —
    writing to an ``expand()``ed tensor; to one of the views ``unbind``/
    ``split``/``chunk`` returned; to a view created under ``no_grad`` while
    grad mode is on; to the output of a module with
    ``register_full_backward_hook`` (Grad-CAM, captum, shap meet this with
    ``nn.ReLU(inplace=True)`` and ``out += identity``).

    Why: PyTorch's message names the rule but not the module or the line in
    your model; inplace-doctor adds both and the specific fix.

    Example::

        hook = lambda module, grad_input, grad_output: None   # Grad-CAM's, captum's ...
        m = torchvision.models.resnet18()
        m.bn1.register_full_backward_hook(hook)
        m(torch.randn(1, 3, 64, 64))   # IPD103 at the ReLU(inplace=True) after bn1

    For one of several views returned together, the finding also names the
    line that made the views (`unbind` when iterating a tensor, `split` for
    ``chunk``), and its fix names both meanings: the piece alone (out of
    place, rebound) or the tensor it came from too (written by index, or
    rebuilt with ``torch.stack``/``cat``); a written ``.clone()`` of the piece
    would lose the write.

    Fix: out-of-place op or a ``.clone()`` before the write, as the finding says.

    Not seen: writes PyTorch allows at the op. Those that overwrite a tensor
    saved for backward are IPD101 (or IPD104 without a version bump); those
    through ``.detach()``/``.data`` into a tensor autograd still tracks are
    IPD110.

    Mode: fast (the default) and deep: the fast tracer serves it (only writes and saves enter Python).
    """
    text = str(event.error)
    cause = next((cause for cause, pattern in _FORWARD_ERRORS if pattern.search(text)), None)
    if cause is None:
        return None
    site = event.site
    raised = RaisedFacts(text.strip().splitlines()[0] if text.strip() else type(event.error).__name__)
    if event.created is not None:  # raised inside backward: the forward line that created the node
        raised = RaisedFacts(raised.error, node=event.node, backward_called_at=site.location)
        site = event.created
    views = event.target_created if cause is ForbiddenCause.MULTIPLE_VIEWS else None
    return make_finding(
        "IPD103",
        fixes=write_fixes(site) if site.module_inplace or cause is ForbiddenCause.MULTIPLE_VIEWS else (),
        mutation=site,
        read=views,
        read_role=SiteRole.VIEWS_MADE,  # the other line: where the views were made
        cause=cause,
        facts=raised,
        confirmed=True,
        root_label=ctx.root_label,
    )
