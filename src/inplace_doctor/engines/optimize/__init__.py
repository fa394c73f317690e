"""optimize: decide every in-place flag from evidence, prove it with verify, measure what it saves.

`decide` holds `optimize()` and how a decision is made; `search` its rounds of audit, memory
and verify; `assemble` measures the result and builds the `Plan`; `plan` the records (`Plan`,
`Decision`, `CheckpointSuggestion`); `checkpoint` measures activation checkpointing; and
`toml_config` reads and writes the `inplace.toml` config. Exports `optimize` and `Plan` (public
as `inplace_doctor.optimize` and `.Plan`), `apply_config` (public too), `load_config`,
`inplace_modules`, `disjoint_holders`, `CHECKPOINT_MIN_SHARE` and the other records.
It may import the records, `trace/`, `rules/`, the engines' shared modules, memory/ and verify/: it is the top of engines/.
"""

from .checkpoint import CHECKPOINT_MIN_SHARE
from .decide import optimize
from .plan import CheckpointSuggestion, Decision, Plan, disjoint_holders
from .toml_config import apply_config, inplace_modules, load_config

__all__ = [
    "CHECKPOINT_MIN_SHARE", "CheckpointSuggestion", "Decision", "Plan", "apply_config", "disjoint_holders",
    "inplace_modules", "load_config", "optimize",
]
