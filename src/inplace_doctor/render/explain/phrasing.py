"""The sentence helpers of render/explain/: how a tensor, a write and its fix read.

A fix is said from the finding's records (`fix_text.said`: edits built from the source by
`rules/fixes/fix_builders.py`); where no record has an edit, in words that quote no code the source
does not hold. What no record speaks for stays here: an optimizer step's manual prose (`step_fix`:
which backward, which parameters, what moving it changes, which the records' `MOVE_STATEMENT` and
`RECOMPUTE` fixes say apart).
"""

from __future__ import annotations

import linecache

from ...findings import Finding, FixKind
from ...rules.fixes.source import tensor_method_exists
from ...rules.phrasing import qualified as qualified  # how rules name places too; here for the explainers
from ...rules.phrasing import where as where
from ...sites import Site, WriteForm, module_ref
from ..code_text import without_comment as without_comment  # quoted lines, for the explainers
from ..fix_text import said as said  # the records' sentence, for the explainers


def short_op(op: str) -> str:
    """`aten.relu_` -> `relu_`, `c10d.broadcast_` stays qualified."""
    return op.removeprefix("aten.")


def tensor_desc(shape: tuple[int, ...], dtype: str) -> str:
    return f"a [{', '.join(map(str, shape))}] {dtype} tensor"


def step_fix(
    site: Site, backward: Site | None, owner: str | None, target: str | None = None, kinds: frozenset[FixKind] | None = None
) -> str:
    """An update of parameters or buffers (an optimizer step, a `no_grad` write to a weight) between a
    forward and the backward that needs that forward's values: keep the update, move it or the forward;
    `kinds`: the fixes the rule found (no move for a statement whose result the forward uses; only a
    detach when that backward is a later run of a line above the update)."""
    if site.api and site.api.endswith(".step"):
        step = f"`{site.api}` at {site.location}"
    else:
        step = f"the update of `{target}` at {site.location}" if target else f"the update at {site.location}"
    later = f"the backward at {backward.location}" if backward is not None and backward.file else "the later backward"
    if kinds is not None and FixKind.DETACH_CARRIED in kinds:
        return (
            f"{later} runs again in a later iteration and reaches the graph an earlier iteration built before "
            f"{step}, through a tensor the loop carries from one iteration to the next (a recurrent state, a "
            "running total kept as a tensor): detach that tensor after the step (`h = h.detach()`), so each "
            "backward stops at its own iteration's graph; moving the step cannot help"
        )
    kinds = frozenset({FixKind.RECOMPUTE, FixKind.MOVE_STATEMENT}) if kinds is None else kinds
    recompute = (
        f"run the forward that {later} uses again after {step}, so its graph holds the updated parameters "
        "(pytorch/examples' DCGAN calls the discriminator again for the generator's loss)"
    )
    if FixKind.MOVE_STATEMENT not in kinds:
        return recompute
    if not (site.api and site.api.endswith(".step")):
        return f"{recompute}; or move {step} after {later}, if that backward is meant to use the old values"
    whose = f"{owner}'s" if owner else "the stepped parameters'"
    return (
        f"{recompute}; or, to keep the old forward, move {step} after {later} and restrict that backward to "
        f"the parameters it should update (`loss.backward(inputs=[...])`): moved alone, that backward's "
        f"gradient also accumulates into {whose} `.grad` and the step applies it"
    )


def silent_write_fix(finding: Finding, root_label: str) -> str:
    """A write through `.data` (or another alias without a version counter) to a tensor in the graph:
    the out-of-place op on the tensor itself keeps the new values and makes autograd see them. The
    records' edit when there is one (`t.data.mul_(2)` -> `t = t.mul(2)`), else what to change in words."""
    records = said(finding, root_label)
    if records:
        return records
    return (
        f"make the write at {finding.mutation.location} out of place on the tensor itself (compute the new values "
        "and bind them to its name, not through `.data` or another alias), or move it after backward: autograd "
        "then differentiates through the change; if the new values must carry no gradient, compute them from a "
        "detached copy (`t.detach().clone()`) and use the copy instead"
    )


def fix_for_write(finding: Finding, root_label: str) -> str:
    """The fix of an in-place write: what the finding's records say (`fix_text.said`, the sentence every
    output prints), else `unedited_write_fix`."""
    return said(finding, root_label) or unedited_write_fix(finding.mutation, root_label)


def unedited_write_fix(site: Site, root_label: str) -> str:
    """What to change at a write no edit was built for (two writes on one line, a function with no
    out-of-place twin such as `init.zeros_`, a chain `h.add_(1).mul_(2)`), in words: the op and the
    place the trace knows, never code made up from the line. A module's `inplace` flag and an optimizer
    step are said as the records would (the constructor's line quoted as the source holds it)."""
    ref = module_ref(site, root_label)
    if site.module_inplace and ref is not None:
        if site.origin is not None:
            built = without_comment(linecache.getline(site.origin.file, site.origin.line).strip())
            return (
                f"construct `{ref}` with inplace=False at {site.origin_location} (`{built}`), "
                f"or set `{ref}.inplace = False`"
            )
        return f"set `{ref}.inplace = False` (or construct it with inplace=False)"
    if site.api and site.api.endswith(".step"):
        return step_fix(site, None, None)
    op, code = short_op(site.op), without_comment(site.code or "")
    clone = "or write into a `.clone()` of that tensor made before the line"
    if site.form is WriteForm.FLAG:
        return f"pass inplace=False instead of inplace=True in the call at {site.location}, {clone}"
    if site.form is WriteForm.AUGMENTED:
        return (
            f"make the augmented assignment at {site.location} out of place (`a = a + b` instead of `a += b`) "
            f"and use the new tensor where the new values are meant, {clone}"
        )
    if op.endswith("_") and f"{op}(" in code and tensor_method_exists(op[:-1]):  # the line calls the op by its name
        return (
            f"use the out-of-place `{op[:-1]}` instead of `{op}` at {site.location} and use its result where the "
            f"new values are meant (the tensor it wrote then keeps its old values), {clone}"
        )
    return f"compute the new values out of place at {site.location} (a new tensor, not a write into this one), {clone}"
