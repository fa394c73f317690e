"""IPD105's and IPD108's sentences: in-place writes that change what the program computes, silently."""

from __future__ import annotations

from ...causes import ChangedResultCause, DifferenceFacts, SideEffectCause, SideEffectFacts
from ...explanations import Sentences, explains
from ...findings import Finding
from .phrasing import fix_for_write, tensor_desc, where


@explains("IPD105", *ChangedResultCause)
def inplace_changes_result(finding: Finding, root_label: str) -> Sentences:
    facts, write = finding.facts, finding.mutation
    assert isinstance(facts, DifferenceFacts) and finding.read is not None
    difference = facts.max_difference
    if difference != difference:  # NaN: the measurement met NaN
        measured = (
            "On this input the values involved hold NaN, so how far what it read is from the original could "
            "not be measured; other inputs will differ."
        )
    elif difference == float("inf"):
        measured = (
            "On this input some values it read are NaN or infinite where the original was not, or the reverse "
            "(or differ from it by more than the dtype can hold); `verify` measures the end result."
        )
    elif difference > 0 and facts.through_alias:  # the largest change over what it wrote, where not copied
        measured = (
            f"On this input the write changed values by up to {difference:.6g} (whether that reaches the output "
            "depends on the ops that follow; `verify` measures the end result)."
        )
    elif difference > 0:
        measured = (
            f"On this input it read values up to {difference:.6g} away from the original (whether that "
            "reaches the output depends on the ops that follow; `verify` measures the end result)."
        )
    else:
        measured = (
            "On this input the values it read happen to equal the original (difference 0), but other inputs "
            "will differ."
        )
    return Sentences(
        what=(
            f"{where(write, root_label)} overwrote {tensor_desc(facts.shape, facts.dtype)}, and then "
            f"{where(finding.read, root_label)} read "
            + ("a view of it made before the write (another tensor object over the same memory, as a slice or "
               "`detach()` is)" if facts.through_alias else "that same tensor")
            + ". With the out-of-place form it would have read the original values."
        ),
        why=f"The forward silently computes something else; PyTorch raises nothing. {measured}",
        fix=fix_for_write(finding, root_label),
    )


@explains("IPD108", SideEffectCause.REPEATED)
def side_effect_repeated(finding: Finding, root_label: str) -> Sentences:
    assert isinstance(finding.facts, SideEffectFacts)
    return Sentences(
        what=(
            f"{where(finding.mutation, root_label)} ran again during backward: {finding.facts.what_changed} "
            "changed a second time."
        ),
        why=(
            "A checkpointed region's forward is recomputed during backward, so its side effects happen twice; "
            "gradients are unaffected, but running statistics used in eval, counters and metrics are off."
        ),
        fix=(
            "keep BatchNorm and in-place accumulations out of the checkpointed region, or guard the "
            "accumulation so it runs once per step"
        ),
    )


@explains("IPD108", SideEffectCause.CHECKPOINT_INPUT)
def write_to_checkpoint_input(finding: Finding, root_label: str) -> Sentences:
    if finding.saved is None:  # seen only as PyTorch's error at backward
        what = f"{where(finding.mutation, root_label)} writes in place to a checkpointed region's input."
    else:
        what = (
            f"{where(finding.mutation, root_label)} writes in place, inside a checkpointed region, to a tensor "
            f"saved at {finding.saved.location} (the region's input)."
        )
    return Sentences(
        what=what,
        why=(
            "The region's forward runs again during backward, on its saved inputs; writing one of them in "
            "place breaks the recompute, and PyTorch raises at backward."
        ),
        fix=(
            "make the write out of place inside the checkpointed function (`x = x * 2`, not `x.mul_(2)`), "
            "or clone the input first (`x = x.clone()`)"
        ),
    )
