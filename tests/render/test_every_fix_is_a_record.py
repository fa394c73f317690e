"""Every fix the text report prints is a record (issue 37, item 10): JSON `fixes[]` is never empty
where the text prints a fix, and each record says itself in the words the text prints (a manual one
has no edits)."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
import torch

import inplace_doctor as ipd
from inplace_doctor.render.json import to_json
from inplace_doctor.render.text import render as render_text


def _leaf() -> None:  # IPD102
    w = torch.randn(3, requires_grad=True)
    with contextlib.suppress(RuntimeError):
        w.add_(1)


def _expanded() -> None:  # IPD103
    e = torch.zeros(1, requires_grad=True).expand(3) * 1
    with contextlib.suppress(RuntimeError):
        e.add_(1)
    f = torch.zeros(1).expand(3)
    with contextlib.suppress(RuntimeError):
        f.add_(1)


def _numpy_write() -> None:  # IPD109
    x = torch.randn(4, requires_grad=True)
    s = torch.sigmoid(x)
    a = s.detach().numpy()
    np.multiply(a, 0.5, out=a)
    s.sum().backward()


@pytest.mark.parametrize("program", [_leaf, _expanded, _numpy_write], ids=["IPD102", "IPD103", "IPD109"])
@pytest.mark.parametrize("deep", [False, True], ids=["fast", "deep"])
def test_json_fixes_carry_what_the_text_prints(program, deep: bool) -> None:
    with ipd.watch(deep=deep) as session:
        program()
    report = session.report()
    assert report.findings
    text = io.StringIO()
    render_text(report, text, color=False)
    printed = [line.split(": ", 1)[1] for line in text.getvalue().splitlines() if line.startswith(("  fix: ", "  or: "))]
    data = to_json(report)
    for finding, entry in zip(report.findings, data["findings"]):
        assert entry["fixes"], f"{finding.code}: the text prints a fix, the JSON has none"
        messages = [fx.get("message") for fx in entry["fixes"]]
        assert all(messages), messages
        for message in messages:  # the same words (the text may add a proven-trust tail)
            assert any(line.startswith(message) for line in printed), (message, printed)
