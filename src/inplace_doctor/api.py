"""The public face: every name `import inplace_doctor as ipd` gives, gathered from the rooms below.

The command line and the pytest plugin import from here, never from the engines directly, so
what users can call and what the tool's own front ends call are the same functions.
"""

from __future__ import annotations

from .engines.audit import audit
from .engines.distributed import gather
from .engines.memory import MemoryReport
from .engines.memory import measure_memory as memory
from .engines.optimize import Plan, apply_config, optimize
from .engines.verify import VerifyResult, verify
from .engines.watch import watch
from .errors import InplaceDoctorError, InplaceError, ModelError, UsageError, WrittenHere
from .findings import Finding, Severity
from .report import Report
from .rules import RULES, Rule, get_rule
from .rules.suppress import suppress
from .sites import Frame, Site

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
    "WrittenHere",
    "apply_config",
    "audit",
    "gather",
    "get_rule",
    "memory",
    "optimize",
    "suppress",
    "verify",
    "watch",
]
