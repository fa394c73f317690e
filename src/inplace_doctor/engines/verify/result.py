"""What `verify()` returns: the records live in `inplace_doctor.verification` (records room), so a
`Report` can hold them; named here too for the engine's own modules."""

from __future__ import annotations

from ...verification import Difference, Differences, InplaceSite, VerifyResult

__all__ = ["Difference", "Differences", "InplaceSite", "VerifyResult"]
