"""DDP on NCCL with one process on one GPU: the job and the checks of test_idioms.py's 2-process gloo run."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _cpu_tests import TESTS, load

WORKER = TESTS / "real_code" / "_ddp_worker.py"
ddp_worker = load("real_code/_ddp_worker.py")

pytestmark = pytest.mark.cuda


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_on_nccl_with_one_process_trains_cleanly_and_gathers(tmp_path: Path) -> None:
    if not (torch.distributed.is_available() and torch.distributed.is_nccl_available()):
        pytest.skip("this torch has no NCCL backend")
    # A process of its own: this one has initialised CUDA (no fork), and the rank sets its default device.
    done = subprocess.run(
        [sys.executable, str(WORKER), "0", "1", str(_free_port()), str(tmp_path), "nccl"],
        capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ddp_worker.check([json.loads((tmp_path / "rank0.json").read_text())])
