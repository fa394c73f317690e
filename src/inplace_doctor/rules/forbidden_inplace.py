"""IPD103: the in-place errors PyTorch raises at the op itself, made specific.

PyTorch's wording changes between releases, so each case is matched loosely. The patterns read
PyTorch's own error messages, never a text of ours: what the rule decides is a `ForbiddenCause`.
"""

from __future__ import annotations

import re
import textwrap

from ..causes import ForbiddenCause, SiteRole
from ..events import InplaceErrorRaised
from ..findings import Finding, Severity
from ..sites import Site, module_ref
from .fix_builders import write_fixes
from .phrasing import first_inplace_call, inplace_statement, where, without_comment
from .registry import RuleContext, make_finding, rule

_FORWARD_ERRORS: tuple[tuple[ForbiddenCause, re.Pattern[str], str, str, str], ...] = (
    (
        ForbiddenCause.EXPANDED,
        re.compile(r"more than one element of the written-to tensor refers to a single memory location", re.I),
        "writes to an expanded (overlapping) tensor",
        "Several elements share one memory location (an `expand()`/`expand_as()` or broadcast view), so "
        "an elementwise in-place op would write the same memory several times",
        "`.clone()` (or `.contiguous()`) the expanded tensor before modifying it, or use the out-of-place op",
    ),
    (
        ForbiddenCause.HOOKED_OUTPUT,
        re.compile(r"BackwardHookFunction", re.I),
        "modifies the output of a module with full backward hooks",
        "`register_full_backward_hook` (Grad-CAM, captum, shap) wraps the module's outputs in a custom "
        "Function; modifying such an output in place would bypass the hook's backward",
        "make the op out of place (for `nn.ReLU(inplace=True)` after the hooked module, set `inplace = "
        "False` on every ReLU: `for m in model.modules(): m.inplace = False` where it has the attribute)",
    ),
    (
        ForbiddenCause.MULTIPLE_VIEWS,
        re.compile(r"function that returns multiple views", re.I),
        "modifies one of several views returned together (`unbind`, `split`, `chunk`)",
        "Autograd cannot rewrite the backward of an op that returned several views when one of them "
        "changes in place",
        "`.clone()` the piece before modifying it, or build the result out of place (`torch.stack`/`cat`)",
    ),
    (
        # Not "Inference tensors cannot be saved for backward": no in-place op there (an input or
        # tensor made under inference_mode reached autograd), so the model's error, not this rule.
        ForbiddenCause.NO_GRAD_VIEW,
        re.compile(r"view was created in (?:no_grad|inference) mode", re.I),
        "modifies, with grad on, a view created under no_grad or inference_mode",
        "The view has no autograd history from its base, so the in-place change cannot be recorded",
        "create the view with grad enabled, or move both the view and the in-place op inside the "
        "`no_grad` (or `inference_mode`) block the view was made in",
    ),
    (
        ForbiddenCause.CUSTOM_FUNCTION_VIEW,
        re.compile(r"view (?:was )?created inside a custom Function|is a view and (?:is being|its base)", re.I),
        "modifies a view whose autograd history cannot be rewritten",
        "The view comes from a custom Function (or an input returned as-is), whose backward would be "
        "overridden by the view+in-place logic",
        "`.clone()` the tensor before modifying it, or return a clone from the custom Function",
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

    Mode: fast and deep: ``watch(deep=False)`` serves it (only writes and saves enter Python).
    """
    text = str(event.error)
    matched = next((case for case in _FORWARD_ERRORS if case[1].search(text)), None)
    if matched is None:
        return None
    cause, _, what, why, fix = matched
    site = event.site
    in_backward = ""
    if event.created is not None:  # raised inside backward: the forward line that created the node
        in_backward = (
            f" PyTorch raised it inside backward (called at {site.location}), in {event.node}, the backward "
            "of this line."
        )
        site = event.created
    ref = module_ref(site, ctx.root_label)
    views = event.target_created if cause is ForbiddenCause.MULTIPLE_VIEWS else None
    if cause is ForbiddenCause.MULTIPLE_VIEWS:
        what, fix = _multiple_views(site, views)
    if ref is not None and site.module_inplace:
        fix = f"set `{ref}.inplace = False`; in general, {fix}"
    first = text.strip().splitlines()[0] if text.strip() else type(event.error).__name__
    return make_finding(
        "IPD103",
        what=f"{where(site, ctx.root_label)} {what}.{in_backward}",
        why=f"{why}; PyTorch raised: \"{textwrap.shorten(first, 400, placeholder=' ...')}\"",
        fix=fix,
        fixes=write_fixes(site) if site.module_inplace or cause is ForbiddenCause.MULTIPLE_VIEWS else (),
        mutation=site,
        read=views,
        read_role=SiteRole.VIEWS_MADE,  # the other line: where the views were made
        cause=cause,
        confirmed=True,
    )


def _multiple_views(site: Site, views: Site | None) -> tuple[str, str]:
    """What happened and the fix, for a write into one of several views returned together. The
    fix names both choices, since which tensor was meant to change is the program's: the piece
    alone (rebind it out of place), or the tensor it came from too (write that one). A `.clone()`
    of the piece, written, changes neither: the write is lost."""
    made = f" by `{views.op.removeprefix('aten.')}` at {views.location}" if views is not None else ""
    what = f"modifies one of several views returned together{made} (`unbind`, iterating a tensor, `split`, `chunk`)"
    code = without_comment(site.code or "")
    statement = inplace_statement(code)
    call = first_inplace_call(code)
    if statement and call is not None and call[0] == code:  # one call alone, not `c.mul_(s).add_(m)`
        target, name = statement["target"], statement["name"]
        fixed = f"{target} = {code.replace(f'.{name}_(', f'.{name}(', 1)}"
        piece = f"rebind it out of place: replace `{code}` with `{fixed}` at {site.location}"
    elif call is not None and not statement:  # its result is used: `f(x.clamp_(a, b))`
        out_of_place = call[0].replace("_(", "(", 1)
        piece = (
            f"use the out-of-place op where its result is used: replace `{call[0]}` with `{out_of_place}` at "
            f"{site.location} (`{call[1]}` itself then keeps its old values)"
        )
    else:
        piece = f"compute it out of place and bind the result to a new name at {site.location}"
    fix = (
        f"decide which tensor is meant to change. Only this piece: {piece} (the tensor it came from keeps its "
        "old values). The tensor it came from too: write into that tensor by index, one piece at a time "
        "(`t[i] = t[i].op(...)` instead of the views), or build it out of place (`torch.stack`/`torch.cat` of "
        "the changed pieces). Writing a `.clone()` of the piece changes neither: the write is lost"
    )
    return what, fix
