"""IPD111's sentences: a checkpointed region's recompute computed other values than its forward."""

from __future__ import annotations

from ...causes import RecomputeCause, RecomputeFacts
from ...explanations import Sentences, explains
from ...findings import Finding
from .phrasing import qualified, tensor_desc, where


@explains("IPD111", *RecomputeCause)
def checkpoint_recompute_differs(finding: Finding, root_label: str) -> Sentences:
    facts, site = finding.facts, finding.mutation
    assert isinstance(facts, RecomputeFacts)
    place = where(site, root_label)
    if finding.cause is RecomputeCause.SAVED_BEFORE_WRITE:
        return _saved_before_write(facts, place, root_label)
    write = facts.write
    first = f"the {_ordinal(facts.position)} op of the region"
    what = f"The checkpoint's recompute of {place} ({first}) produced other values than its forward did."
    if finding.cause is RecomputeCause.RNG:
        if facts.rng_preserved is False:
            reason = (
                f"`{site.op}` draws random numbers and the region runs with preserve_rng_state=False: "
                "the recompute draws other ones (another dropout mask)."
            )
            fix = "pass preserve_rng_state=True to checkpoint (the default), or move the random op out of the region"
        else:
            reason = (
                f"`{site.op}` draws random numbers, and the generator was not in the same state for the "
                "recompute (another device's or a custom generator, which checkpoint does not restore)."
            )
            fix = "draw the random numbers outside the region and pass them in, or use the default generator"
    elif write is not None:
        target = (
            qualified(facts.write_target, root_label) if facts.write_target
            else tensor_desc(facts.write_shape, facts.write_dtype)
        )
        written_at = where(write, root_label)
        if facts.write_in_region:
            reason = (
                f"It reads {target}, which the region itself writes in place ({written_at}): the recompute ran "
                "that write again and read the new value."
            )
            fix = "move the in-place update out of the checkpointed region, or make it out of place"
        else:
            reason = (
                f"It reads {target}, which {written_at} wrote after the forward read it: the recompute read "
                "the new value."
            )
            fix = (
                "make that write after backward() (or give the region a copy: `.clone()` what it reads), so "
                "the state the region reads is the same in forward and recompute"
            )
    elif facts.input_version_changed:
        reason = "A tensor it reads from outside the region was modified in place after the forward read it."
        fix = "make that change after backward(), or give the region a copy of what it reads"
    elif facts.nondeterministic_kernels:
        # No cause the tracer sees, on a device whose kernels may differ in the last bits run to run:
        # the gradients may differ from the forward's only by rounding, which is no error.
        reason = (
            "Its inputs from earlier ops of the region matched, and it ran on an accelerator with "
            "nondeterministic algorithms allowed: atomics (index_add_, scatter_add_, some convolution and "
            "matmul algorithms) can differ in the last bits from run to run, and then the gradients differ "
            "from the forward's only by rounding. Not certain either way: a tensor it reads may also have "
            "changed without a write the tracer sees (`.data` through numpy, another process)."
        )
        fix = (
            "run once with torch.use_deterministic_algorithms(True): if the finding stays, the values really "
            "changed; if it goes, it was the kernel's rounding"
        )
    else:
        reason = (
            "Its inputs from earlier ops of the region matched: the kernel is nondeterministic, or a tensor it "
            "reads changed without a write the tracer sees (`.data` through numpy, another process)."
        )
        fix = "make the op deterministic (torch.use_deterministic_algorithms), or do not checkpoint it"
    return Sentences(
        what=what,
        why=(
            f"{reason} PyTorch checks only the recomputed shapes, dtypes and devices, not the values: backward "
            "uses the recomputed activations, so the gradients are silently those of another computation."
        ),
        fix=fix,
    )


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"



def _saved_before_write(facts: RecomputeFacts, place: str, root_label: str) -> Sentences:
    """A kernel that writes what its node saved (`F.rrelu`'s noise), cut off by the recompute's early stop."""
    call = where(facts.checkpoint_call, root_label) if facts.checkpoint_call else "the `checkpoint` call"
    argument = facts.argument
    return Sentences(
        what=(
            f"{place} (the {_ordinal(facts.position)} op of the region checkpointed by {call}) writes its argument "
            f"`{argument}` ({tensor_desc(facts.write_shape, facts.write_dtype)}) after autograd saved it for "
            f"backward. The checkpoint's recompute stopped before that write: backward read `{argument}` as the "
            f"recompute saved it ({_values(facts.saved_values)}), not the values the forward wrote "
            f"({_values(facts.written_values)})."
        ),
        why=(
            "Non-reentrant checkpoint with early stop (the default) ends the recompute as soon as it has saved "
            "as many tensors as the forward did; this op's own input saves are the region's last, so its kernel "
            f"does not run again and {_saved_value(facts)}. PyTorch checks only the recomputed shapes, dtypes "
            "and devices: the forward output is bit-exact while the gradients are silently wrong."
        ),
        fix=(
            f"pass early_stop=False to {call} (the recompute then runs the region to its "
            "end and, with preserve_rng_state=True, the default, writes the same values again), or move the op "
            "(F.rrelu, nn.RReLU) out of the checkpointed region"
        ),
    )


def _values(values: tuple[float, ...]) -> str:
    return ", ".join(f"{v:.4g}" for v in values) + ", ..." if values else "..."


def _saved_value(facts: RecomputeFacts) -> str:
    if facts.outside:
        return (
            f"`{facts.argument}`, a tensor from outside the region, is saved as it is at backward: written "
            "again since the forward wrote it"
        )
    if facts.uninitialised:
        return f"`{facts.argument}` keeps its value from before the write: uninitialised memory (`empty_like`)"
    return f"`{facts.argument}` keeps the value the region gave it before the write"
