"""The HTML report: self-contained, opens in headless Chromium without console errors, chart visible."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.cli.main import main
from inplace_doctor.render.html import write_html

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("INPLACE_DOCTOR_REQUIRE_CHROMIUM"),
    reason="headless Chromium is not installed (.ci/run installs Debian's chromium)",
)


def sgd(params):
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(64, 256), nn.ReLU(inplace=True), nn.Linear(256, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.sigmoid(self.fc1(x))
        return self.fc2(self.act(h))  # overwrites sigmoid's saved result: IPD101


@pytest.fixture(scope="module")
def report_file(tmp_path_factory) -> str:
    torch.manual_seed(0)
    model, x = Net(), torch.randn(32, 64)
    plan = ipd.optimize(model, x, optimizer=sgd, suggest_checkpoint=False)
    report = ipd.audit(model, x)
    path = str(tmp_path_factory.mktemp("html") / "report.html")
    write_html(path, "inplace-doctor test report", report=report, plan=plan)
    return path


def test_the_page_is_self_contained(report_file: str) -> None:
    text = Path(report_file).read_text(encoding="utf-8")
    assert "<script" not in text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert "IPD101" in text and 'id="memory-timeline"' in text and "Decisions" in text


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None, "INPLACE_DOCTOR_REQUIRE_CHROMIUM is set but chromium is not installed"
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
         "--no-first-run", "--disable-dev-shm-usage", *args],
        capture_output=True, text=True, timeout=120,
    )


@needs_chromium
def test_chromium_renders_the_chart_without_console_errors(report_file: str, tmp_path) -> None:
    done = _chromium("--dump-dom", f"file://{report_file}")
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    lines = re.findall(r'<polyline class="series" data-label="([^"]+)"[^>]*points="([^"]+)"', dom)
    assert {label for label, _ in lines} == {"planned"}  # the shipped model raises: no shipped series
    assert len(lines[0][1].split()) > 10
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == [], console
    # And the chart is painted: the series colour appears in a screenshot.
    shot = tmp_path / "shot.png"
    done = _chromium(f"--screenshot={shot}", "--window-size=1200,2400", f"file://{report_file}")
    assert shot.exists(), done.stderr[-2000:]
    from torchvision.io import read_image

    image = read_image(str(shot))[:3].to(torch.int32)
    blue = torch.tensor([31, 119, 180], dtype=torch.int32).view(3, 1, 1)
    assert int(((image - blue).abs().sum(0) < 40).sum()) > 200


def test_cli_writes_html_for_audit_memory_and_optimize(tmp_path, capsys) -> None:
    for command, example in (("audit", "sigmoid_then_relu"), ("memory", "linear_then_relu"), ("optimize", "sigmoid_then_relu")):
        path = tmp_path / f"{command}.html"
        code = main([command, f"inplace_doctor.examples:{example}", "--html", str(path)])
        assert code == (1 if command == "audit" else 0), command
        text = path.read_text()
        assert text.startswith("<!DOCTYPE html>") and "</html>" in text
        if command != "audit":
            assert 'id="memory-timeline"' in text
    capsys.readouterr()


def test_memory_of_a_model_whose_step_raises_says_what_to_run_instead(capsys) -> None:
    assert main(["memory", "inplace_doctor.examples:sigmoid_then_relu"]) == 3  # the step raised: the model error code, with the command that names both culprits
    err = capsys.readouterr().err
    assert "modified by an inplace operation" in err and "inplace-doctor audit inplace_doctor.examples:sigmoid_then_relu" in err
