"""The English of every finding: one explainer per rule and cause, from the finding's records.

A rule decides (a cause, a facts record, its sites and fixes); the function registered here
for (rule code, cause) with `explanations.explains` turns those records into the finding's
three sentences: what happened (with the concrete values), why it matters, the exact fix. One
module per rule module of `rules/`, named alike, so a new cause is one new function in the
module of its rule. These modules may import the records, `trace/` (PyTorch's messages in the
user's terms) and `rules/` (the source readers), never engines/ or cli/; importing render/
(which the package's `__init__` does) registers them all.
"""

from __future__ import annotations

import importlib
import pkgutil

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")  # each module registers its explainers: none is listed by hand
