"""A report crosses a process as its records (issue 39): `Report.from_dict(r.to_dict())` is `r`
again, `run --verify`'s verdicts included, through real JSON."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.report import Report
from inplace_doctor.verification import ModelVerified, VerifyOutcome


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return self.act(h) + h  # the residual reads what the in-place ReLU overwrote


class SigmoidThenInplace(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(x * 1)
        return y.mul_(2)


def _through_json(report: Report) -> Report:
    return Report.from_dict(json.loads(json.dumps(report.to_dict())))


def test_an_audit_report_round_trips_with_its_words():
    report = ipd.audit(SigmoidThenInplace(), torch.randn(3, 4, requires_grad=True))
    assert report.findings
    back = _through_json(report)
    assert back.findings == report.findings and back.notes == report.notes and back.stats == report.stats
    assert json.loads(json.dumps(back.to_dict())) == json.loads(json.dumps(report.to_dict()))
    assert str(back) == str(report)  # the text report, made again from the records


def test_run_verify_verdicts_round_trip():
    torch.manual_seed(0)
    result = ipd.verify(Residual(), torch.randn(4, 6))
    assert not result.equivalent
    verdicts = [
        ModelVerified.of("Residual", True, result),
        ModelVerified("Net", VerifyOutcome.NOT_VERIFIED, None, None, "a process group"),
    ]
    report = Report(findings=list(result.findings), command="run", verify_results=verdicts)
    back = _through_json(report)
    assert json.loads(json.dumps(back.to_dict())) == json.loads(json.dumps(report.to_dict()))
    assert [str(v) for v in back.verify_results] == [str(v) for v in verdicts]


def test_a_report_of_another_schema_version_is_refused_in_words():
    data = Report(findings=[]).to_dict() | {"schema_version": 1}
    with pytest.raises(ValueError, match="schema version 1"):
        Report.from_dict(data)
