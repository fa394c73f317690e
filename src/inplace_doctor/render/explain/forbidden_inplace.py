"""IPD103's sentences: the in-place errors PyTorch raises at the op, with the module, line and fix."""

from __future__ import annotations

import re
import textwrap

from ...causes import ForbiddenCause, RaisedFacts
from ...explanations import Sentences, explains
from ...findings import Finding
from ...sites import module_ref
from ..fix_text import several_views
from .phrasing import said, where

# cause -> (what the op did, why PyTorch refuses it, the fix)
_WORDS: dict[ForbiddenCause, tuple[str, str, str]] = {
    ForbiddenCause.EXPANDED: (
        "writes to an expanded (overlapping) tensor",
        "Several elements share one memory location (an `expand()`/`expand_as()` or broadcast view), so "
        "an elementwise in-place op would write the same memory several times",
        "`.clone()` (or `.contiguous()`) the expanded tensor before modifying it, or use the out-of-place op",
    ),
    ForbiddenCause.HOOKED_OUTPUT: (
        "modifies the output of a module with full backward hooks",
        "`register_full_backward_hook` (Grad-CAM, captum, shap) wraps the module's outputs in a custom "
        "Function; modifying such an output in place would bypass the hook's backward",
        "make the op out of place (for `nn.ReLU(inplace=True)` after the hooked module, set `inplace = "
        "False` on every ReLU: `for m in model.modules(): m.inplace = False` where it has the attribute)",
    ),
    ForbiddenCause.MULTIPLE_VIEWS: (
        "modifies one of several views returned together (`unbind`, `split`, `chunk`)",
        "Autograd cannot rewrite the backward of an op that returned several views when one of them "
        "changes in place",
        "`.clone()` the piece before modifying it, or build the result out of place (`torch.stack`/`cat`)",
    ),
    ForbiddenCause.NO_GRAD_VIEW: (
        "modifies, with grad on, a view created under no_grad or inference_mode",
        "The view has no autograd history from its base, so the in-place change cannot be recorded",
        "create the view with grad enabled, or move both the view and the in-place op inside the "
        "`no_grad` (or `inference_mode`) block the view was made in",
    ),
    ForbiddenCause.CUSTOM_FUNCTION_VIEW: (
        "modifies a view whose autograd history cannot be rewritten",
        "The view comes from a custom Function (or an input returned as-is), whose backward would be "
        "overridden by the view+in-place logic",
        "`.clone()` the tensor before modifying it, or return a clone from the custom Function",
    ),
}


@explains("IPD103", *ForbiddenCause)
def forbidden_inplace(finding: Finding, root_label: str) -> Sentences:
    assert isinstance(finding.cause, ForbiddenCause) and isinstance(finding.facts, RaisedFacts)
    raised, site = finding.facts, finding.mutation
    what, why, fix = _WORDS[finding.cause]
    in_backward = ""
    if raised.backward_called_at is not None:  # raised inside backward: `site` is the forward line
        in_backward = (
            f" PyTorch raised it inside backward (called at {raised.backward_called_at}), in {raised.node}, the "
            "backward of this line."
        )
    if finding.cause is ForbiddenCause.MULTIPLE_VIEWS:
        what, fix = _multiple_views(finding, root_label)
    if finding.cause is ForbiddenCause.CUSTOM_FUNCTION_VIEW:
        fix = _custom_function_fix(raised.error, site.location)
    ref = module_ref(site, root_label)
    if ref is not None and site.module_inplace:
        fix = f"set `{ref}.inplace = False`; in general, {fix}"
    return Sentences(
        what=f"{where(site, root_label)} {what}.{in_backward}",
        why=f"{why}; PyTorch raised: \"{textwrap.shorten(raised.error, 400, placeholder=' ...')}\"",
        fix=fix,
    )


def _multiple_views(finding: Finding, root_label: str) -> tuple[str, str]:
    """What happened and the fix, for a write into one of several views returned together: the fix
    of the piece as its records say it (`fix_text.several_views` around it), else in words."""
    site, views = finding.mutation, finding.read
    made = f" by `{views.op.removeprefix('aten.')}` at {views.location}" if views is not None else ""
    what = f"modifies one of several views returned together{made} (`unbind`, iterating a tensor, `split`, `chunk`)"
    fix = said(finding, root_label) or several_views(
        f"compute it out of place and bind the result to a new name at {site.location}"
    )
    return what, fix


# Over PyTorch's own message ("Output 0 of MyFn is a view", "of MyFnBackward" in older releases).
_FUNCTION = re.compile(r"Output \d+ of (\w+?)(?:Backward\d*)? is a view")


def _custom_function_fix(error: str, at: str) -> str:
    """The fix of a write into what a custom Function returned as-is: in the Function, a clone (or,
    when its forward writes its input and returns it, `ctx.mark_dirty`), else a clone before the write."""
    found = _FUNCTION.search(error)
    name = f"`{found[1]}`" if found else "the custom Function"
    return (
        f"in {name}'s forward, return a `.clone()` of an input it returns unchanged; if forward writes that "
        f"input in place and returns it, declare it with `ctx.mark_dirty(x)`; or `.clone()` the output before "
        f"the write at {at}"
    )
