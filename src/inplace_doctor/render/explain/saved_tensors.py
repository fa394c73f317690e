"""IPD101's and IPD104's sentences: a tensor autograd saved for backward, overwritten."""

from __future__ import annotations

import math

from ...causes import RaisedFacts, SavedTensorCause, SilentOverwriteCause, VersionFacts
from ...explanations import Sentences, explains
from ...findings import Finding
from ...sites import Site
from .phrasing import fix_for_write, qualified, short_op, silent_write_fix, step_fix, tensor_desc, where

_ERROR = '"one of the variables needed for gradient computation has been modified by an inplace operation"'


@explains("IPD101", SavedTensorCause.OVERWRITTEN)
def saved_tensor_overwritten(finding: Finding, root_label: str) -> Sentences:
    facts = _version_facts(finding)
    if facts.counter_only:  # another row of the saved tensor's base, or a metadata-only op
        what = (
            f"{where(finding.mutation, root_label)} wrote {tensor_desc(facts.write_shape, facts.write_dtype)} that "
            f"shares its version counter with {_saved_phrase(finding, root_label)}, changing none of the elements "
            "autograd saved."
        )
        counter = " Autograd checks that counter, not the values: the saved elements being intact does not help."
    else:
        what = (
            f"{where(finding.mutation, root_label)} overwrote {_written_desc(finding, facts, root_label)}, which "
            f"{_saved_phrase(finding, root_label)}."
        )
        counter = ""
    return Sentences(
        what=what,
        why=_overwritten_why(facts, bool(finding.confirmed)) + counter + compiled_note(finding.saved, finding.mutation),
        fix=_fix(finding, facts.backward, root_label),
    )


@explains("IPD101", SavedTensorCause.ALSO_WRITTEN)
def saved_tensor_also_written(finding: Finding, root_label: str) -> Sentences:
    """An earlier write to the saved tensor, confirmed with the last one (`facts.then`): its own
    write and fix, and why in the last write's terms (all must move for backward to run)."""
    facts = _version_facts(finding)
    assert facts.then is not None
    if facts.updates:  # parameter updates: no write can go to a copy instead
        rest = "each must be moved after backward, or the forward run again after the last, for backward to run"
    else:
        rest = (
            "changing one write can be enough: once the first goes to a copy (or a new tensor bound to the "
            "same name), the later ones write that instead of the saved tensor. The fixes, one per write, "
            "are alternatives"
        )
    own = saved_tensor_overwritten(finding, root_label)
    why = (
        f"This write changed the tensor too, before the write at {facts.then_at}; {rest}. "
        f"{_overwritten_why(facts.then, True)}"
    )
    return Sentences(what=own.what, why=why, fix=own.fix)


@explains("IPD101", SavedTensorCause.WRITE_NOT_SEEN)
def saved_tensor_write_not_seen(finding: Finding, root_label: str) -> Sentences:
    facts = _version_facts(finding)
    saved_at = finding.saved.location if finding.saved is not None else "an unknown line"
    return Sentences(
        what="",
        why=(
            f"Backward reached `{finding.slot}`, saved at {saved_at}, and found it overwritten: "
            f"version {facts.version_now}, autograd saved version {facts.saved_version}. The write happened "
            "outside the instrumented code (or before a second backward through a retained graph)."
        ),
        fix="find the in-place write to this tensor between its save and backward (run it inside watch(fail_fast=True))",
    )


@explains("IPD101", SavedTensorCause.RAISED_BEFORE_WATCH)
def saved_tensor_raised_before_watch(finding: Finding, root_label: str) -> Sentences:
    facts = finding.facts
    assert isinstance(facts, RaisedFacts)
    what = f"`{facts.node}` saved a [{facts.shape}] tensor" if facts.node is not None else "a saved tensor"
    return Sentences(
        what="",
        why=(
            f"PyTorch raised at backward ({finding.mutation.location}): {what} that was modified in place after it "
            "was saved. The save and the write happened outside inplace-doctor's view (before watch() began), "
            "so only PyTorch's own check saw it."
        ),
        fix="run the forward pass inside watch() too, so both the saving and the overwriting line are named",
    )


@explains("IPD104", *SilentOverwriteCause)
def saved_tensor_silently_overwritten(finding: Finding, root_label: str) -> Sentences:
    facts, write = _version_facts(finding), finding.mutation
    if finding.cause is SilentOverwriteCause.NO_VERSION_BUMP:
        alias = f"with `{short_op(write.op)}`, which bumps no version counter at all"
    elif finding.cause is SilentOverwriteCause.DATA_ALIAS:
        alias = "through `.data`"
    else:
        alias = "through an alias that does not share its version counter"
    node = facts.node or "its autograd node"
    if finding.confirmed:
        why = (
            f"Autograd could not notice (the saved tensor's version stayed {facts.saved_version}): backward read "
            f"the new values at {node} with no error, so the gradients it computed from them are silently wrong."
        )
    else:
        why = (
            f"Autograd cannot notice: the saved tensor's version stays {facts.saved_version}, so a backward that "
            f"reaches {node} will silently compute gradients from the new values. A graph freed without such a "
            "backward is harmless."
        )
    return Sentences(
        what=(
            f"{where(write, root_label)} changed the memory of {_written_desc(finding, facts, root_label)}, "
            f"which {_saved_phrase(finding, root_label)}, {alias}."
        ),
        why=why,
        fix=_fix(finding, None, root_label) if _is_update(finding) else silent_write_fix(finding, root_label),
    )


def _version_facts(finding: Finding) -> VersionFacts:
    assert isinstance(finding.facts, VersionFacts)
    return finding.facts


def _overwritten_why(facts: VersionFacts, confirmed: bool) -> str:
    node = facts.node or "its autograd node"
    if confirmed:
        backward = facts.backward
        at = f" ({backward.location})" if backward is not None and backward.file else ""
        return (
            f"Backward{at} raised {_ERROR} when it reached {node}: the tensor was at version {facts.version_now}, "
            f"autograd saved version {facts.saved_version}."
        )
    return (
        f"A backward that reaches {node} will raise {_ERROR}: the tensor is now at version {facts.version_now}, "
        f"autograd saved version {facts.saved_version}. A graph that is freed without such a backward is harmless."
    )


def _is_update(finding: Finding) -> bool:
    api = finding.mutation.api
    return bool((api and api.endswith(".step")) or finding.target)


def _fix(finding: Finding, backward: Site | None, root_label: str) -> str:
    write, target = finding.mutation, finding.target
    if _is_update(finding):
        # A parameter or buffer update is the program's intent: never drop it, order it.
        owner = (root_label or target.split(".")[0]) if target else None
        kinds = frozenset(f.kind for f in finding.fixes) or None
        return step_fix(write, backward, owner, qualified(target, root_label) if target else None, kinds)
    return fix_for_write(finding, root_label)


def _saved_phrase(finding: Finding, root_label: str) -> str:
    assert finding.saved is not None
    return f"`{finding.slot}` saved for backward ({where(finding.saved, root_label)})"


def _written_desc(finding: Finding, facts: VersionFacts, root_label: str) -> str:
    """The written tensor as the user sees it (`D.2.weight`, a [1, 128] float32 tensor), and how
    autograd saved it when that differs (`Linear` saves its weight transposed)."""
    desc = tensor_desc(facts.write_shape, facts.write_dtype)
    if finding.target:
        desc = f"`{qualified(finding.target, root_label)}` ({desc.removeprefix('a ')})"
    written, saved = tuple(facts.write_shape), tuple(facts.saved_shape)
    if saved != written and saved:
        shape = f"[{', '.join(map(str, saved))}]"
        if len(saved) == 2 and saved == tuple(reversed(written)):
            desc += f", saved as its transpose {shape}"
        elif math.prod(saved) > math.prod(written):
            desc += f" (part of the {shape} tensor saved)"
        else:
            desc += f", saved as a {shape} view of it"
    return desc


def compiled_note(saved: Site | None, write: Site) -> str:
    """What the program does without the tool when the tensor was saved inside `torch.compile`d code,
    which the tool runs eagerly (measured on torch 2.14.1, CPU, inductor): "" otherwise."""
    if saved is None or not saved.in_compiled:
        return ""
    eager = (
        " The tensor was saved inside torch.compile'd code, which inplace-doctor runs eagerly while it watches,"
        " as PyTorch runs this program without torch.compile."
    )
    if write.in_compiled:
        return eager + (
            " Compiled, torch.compile traces this backward while it compiles and, with the save and"
            " the write in one compiled graph, stops with this error inside BackendCompilerFailed."
        )
    return eager + (
        " Compiled, its backward reads the tensors the compiler chose to save, not necessarily this one:"
        " where the compiler saved this one (a Linear's input, `sigmoid`'s output) it raises the same error;"
        " where it kept its own (inductor does for `relu`'s output) the program runs on without error, with"
        " the gradients of the out-of-place program (its backward reads the values from before the write),"
        " and raises wherever it runs uncompiled."
    )
