"""inplace-doctor: find the in-place operations that break autograd, and name both culprits.

    import inplace_doctor as ipd
    report = ipd.audit(model, x)          # one instrumented forward + backward
    with ipd.watch() as session:          # or any training code
        train_step()
    mem = ipd.memory(model, x, optimizer=opt)  # where a training step's memory goes
"""

from __future__ import annotations

import warnings

# Without numpy, torch warns "Failed to initialize NumPy" when it is first imported; the tool
# needs no numpy, and the first thing `inplace-doctor audit ...` prints should be the report.
# Exactly that warning, and only if this import is torch's first.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    import torch  # noqa: F401

from . import _compat  # noqa: F401,E402  (fails early, naming the torch version)
from .engines.audit import audit, watch
from .engines.distributed import gather
from .engines.verify.equivalence import VerifyResult, verify
from .errors import InplaceDoctorError, InplaceError, ModelError, UsageError, WrittenHere
from .findings import Finding, Severity
from .engines.optimize.toml_config import apply_config
from .engines.memory.ledger import MemoryReport
from .engines.memory.ledger import measure_memory as memory
from .engines.optimize.decide import Plan, optimize
from .report import Report
from .rules import RULES, Rule, get_rule
from .sites import Frame, Site
from .rules.suppress import suppress

__version__ = "0.1.0"

__all__ = [
    "Finding",
    "Frame",
    "InplaceDoctorError",
    "InplaceError",
    "MemoryReport",
    "ModelError",
    "Plan",
    "RULES",
    "Report",
    "Rule",
    "Severity",
    "Site",
    "UsageError",
    "VerifyResult",
    "apply_config",
    "audit",
    "gather",
    "get_rule",
    "memory",
    "optimize",
    "suppress",
    "verify",
    "watch",
    "WrittenHere",
]
