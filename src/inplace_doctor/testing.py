"""Assertions for users' own test suites.

    from inplace_doctor.testing import assert_inplace_safe, assert_equivalent

    def test_model_inplace():
        assert_inplace_safe(MyModel(), torch.randn(2, 3, 64, 64))
        assert_equivalent(MyModel(), torch.randn(2, 3, 64, 64))
"""

from __future__ import annotations

from typing import Any

import torch

from .api import Report, Severity, VerifyResult, audit, verify


def assert_inplace_safe(model: torch.nn.Module, *args: Any, **kwargs: Any) -> Report:
    """Fail unless `audit` reports no finding of severity error or warning; the message is the text report."""
    __tracebackhide__ = True
    report = audit(model, *args, **kwargs)
    if report.failed(Severity.WARNING):
        raise AssertionError("in-place hazards found:\n" + str(report))
    return report


def assert_equivalent(model: torch.nn.Module, *args: Any, **kwargs: Any) -> VerifyResult:
    """Fail unless `verify` finds the in-place configuration equivalent; the message names the culprit."""
    __tracebackhide__ = True
    result = verify(model, *args, **kwargs)
    if not result:
        raise AssertionError(str(result))
    return result


__all__ = ["assert_equivalent", "assert_inplace_safe"]
