"""The memory benchmark that docs/memory.md comes from runs, and its rows say what they measured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "memory.py"


def test_memory_benchmark_prints_a_verified_row_per_model_in_the_order_asked() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--models", "squeezenet1_1,mnasnet0_5", "--jobs", "2", "--input", "2x3x32x32"],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and not line.startswith("| model")]
    names = [row.split("|")[1].strip() for row in rows]
    assert names[:2] == ["squeezenet1_1", "mnasnet0_5"]  # --jobs keeps the order asked for
    assert len(names) == 4  # and the transformer encoder and the Dropout MLP
    for row in rows[:2]:
        cells = [c.strip() for c in row.split("|")[1:-1]]
        off, shipped, planned = (int(c.replace(",", "")) for c in cells[2:5])
        assert off == shipped == planned > 0, row  # in-place saves nothing on these nets
        assert int(cells[5].split()[0].replace(",", "")) <= planned, row  # checkpointing frees, never adds
        assert cells[6] == "0" and cells[7] == "yes", row
