"""IPD102's sentences: an in-place op on a leaf that requires grad (or a view of one)."""

from __future__ import annotations

from ...causes import LeafCause
from ...explanations import Sentences, explains
from ...findings import Finding
from .phrasing import fix_for_write, where


@explains("IPD102", LeafCause.LEAF, LeafCause.VIEW_OF_LEAF)
def inplace_on_leaf(finding: Finding, root_label: str) -> Sentences:
    kind = "a view of a leaf tensor" if finding.cause is LeafCause.VIEW_OF_LEAF else "a leaf tensor"
    site = finding.mutation
    return Sentences(
        what=f"{where(site, root_label)} modifies {kind} that requires grad, with grad mode on.",
        why="PyTorch raises at once: the gradient for that leaf would have to flow into a value that no longer exists.",
        fix=f"if this updates parameters, wrap it in `with torch.no_grad():`; otherwise {fix_for_write(finding, root_label)}",
    )
