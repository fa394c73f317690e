"""How rules and engines name a place: a site (`where`), a parameter or module as the user writes it
(`qualified`, `place_of`: a finding's `places`), and an error raised inside backward in the
forward's terms (`raised_in_backward`, for the engines' error messages).

The sentences of findings are made in render/explain/ (its `phrasing` holds the sentence helpers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..sites import Site, describe_site, module_ref
from ..trace.places.nodes import in_user_terms

if TYPE_CHECKING:
    from ..findings import Finding


def where(site: Site, root_label: str) -> str:
    """`relu_` in model.features.3 (ReLU, call 2) at model.py:42."""
    return describe_site(site, root_label)


def raised_in_backward(event: Any, root_label: str) -> str | None:
    """For an error raised inside backward: the node it was raised in and the forward line that
    created it (`in CopySlices, the backward of `index_put_` in model (M) at m.py:26`), with the
    reason in the forward's terms where PyTorch's wording names only the node; None otherwise."""
    created = getattr(event, "created", None)
    if created is None:
        return None
    return (
        f"raised inside backward, in {event.node}, the backward of {where(created, root_label)}: "
        f"{in_user_terms(event.error, event.node)}"
    )


def qualified(name: str, root_label: str) -> str:
    """A parameter's or module's name as the user writes it: `model.2.weight`, `D.2.weight`."""
    return f"{root_label}.{name}" if root_label and name else (name or root_label)


def place_of(finding: Finding, root_label: str) -> str:
    """What one occurrence of a finding is about: the parameter written, else the module that wrote."""
    if finding.target:
        return qualified(finding.target, root_label)
    for site in (finding.mutation, finding.saved, finding.read):
        if site is not None and site.module is not None:
            ref = module_ref(site, root_label)
            if ref:
                return ref
    return ""
