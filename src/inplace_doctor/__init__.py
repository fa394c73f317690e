"""inplace-doctor: find the in-place operations that break autograd, and name both culprits.

    import inplace_doctor as ipd
    report = ipd.audit(model, x)          # one instrumented forward + backward
    with ipd.watch() as session:          # or any training code
        train_step()
"""

from __future__ import annotations

from . import _compat  # noqa: F401  (fails early, naming the torch version)
from .api import audit, watch
from .equivalence import VerifyResult, verify
from .errors import InplaceDoctorError, InplaceError, ModelError, UsageError
from .findings import Finding, Severity
from .report import Report
from .rules import RULES, Rule, get_rule
from .sites import Frame, Site

__version__ = "0.1.0"

__all__ = [
    "Finding",
    "Frame",
    "InplaceDoctorError",
    "InplaceError",
    "ModelError",
    "RULES",
    "Report",
    "Rule",
    "Severity",
    "Site",
    "UsageError",
    "VerifyResult",
    "audit",
    "get_rule",
    "verify",
    "watch",
]
