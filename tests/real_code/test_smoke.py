"""The README's bundled example reports its finding with both lines."""

import torch

import inplace_doctor as ipd
from inplace_doctor.examples import LinearThenReLU, SigmoidThenReLU


def test_bundled_broken_example_names_both_lines():
    report = ipd.audit(SigmoidThenReLU(), torch.randn(4, 8))
    [finding] = report.findings
    assert finding.code == "IPD101"
    assert finding.mutation.code == "return self.act(gate)  # ... which the in-place ReLU overwrites"
    assert finding.saved.code.startswith("gate = torch.sigmoid(self.fc(x))")
    assert finding.confirmed is True


def test_bundled_clean_example_is_clean():
    assert ipd.audit(LinearThenReLU(), torch.randn(4, 8)).findings == []
