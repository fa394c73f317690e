"""`fix` (and `run --prove`) check each edit on scratch copies of the working directory: a folder
holding a dataset or checkpoints would be copied again for every check, onto the scratch disk.
Such a folder is refused before anything is copied, in one line that names what is large and the
way out. (Large files here are sparse: they take no disk, and refusing must not read or copy them.)"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from inplace_doctor.cli.errors import CliUsageError
from inplace_doctor.cli.proof.copy_room import COPY_LIMIT
from inplace_doctor.cli.proof.prove import Workspace

BROKEN = """import torch
x = torch.randn(4, requires_grad=True)
h = torch.sigmoid(x)
h.mul_(2)
h.sum().backward()
"""


def sparse(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)


def scratch_folders() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("inplace-doctor-fix-")}


def test_a_folder_over_the_limit_is_refused_before_anything_is_copied(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(COPY_LIMIT, raising=False)
    (tmp_path / "train.py").write_text(BROKEN)
    sparse(tmp_path / "data" / "train.bin", 3 << 30)  # over the 2 GiB default
    before = scratch_folders()
    with pytest.raises(CliUsageError) as refused:
        Workspace(str(tmp_path), "train.py", [], None)
    message = str(refused.value)
    assert "\n" not in message
    assert "more than 2.00 GiB" in message and "data/ 3.00 GiB" in message and COPY_LIMIT in message, message
    assert scratch_folders() == before  # no scratch folder made


@pytest.mark.parametrize(("limit", "refused"), [("1M", True), ("1MiB", True), ("3m", False), ("4000000", False)])
def test_the_limit_is_read_from_the_environment(tmp_path: Path, monkeypatch, limit: str, refused: bool) -> None:
    monkeypatch.setenv(COPY_LIMIT, limit)
    (tmp_path / "train.py").write_text(BROKEN)
    (tmp_path / "weights.pt").write_bytes(b"\0" * (2 << 20))  # 2 MiB
    if refused:
        with pytest.raises(CliUsageError, match="weights.pt 2.00 MiB"):
            Workspace(str(tmp_path), "train.py", [], None)
        return
    ws = Workspace(str(tmp_path), "train.py", [], None)
    try:
        assert (Path(ws.base) / "weights.pt").stat().st_size == 2 << 20
    finally:
        ws.close()


def test_caches_and_environments_it_does_not_copy_do_not_count(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(COPY_LIMIT, "1M")
    (tmp_path / "train.py").write_text(BROKEN)
    sparse(tmp_path / ".venv" / "lib" / "torch.so", 3 << 30)
    sparse(tmp_path / ".git" / "objects" / "pack.pack", 3 << 30)
    ws = Workspace(str(tmp_path), "train.py", [], None)
    ws.close()


@pytest.mark.parametrize("value", ["abc", "-1G", "inf", "G"])
def test_a_limit_that_is_no_size_is_one_line_naming_the_variable(tmp_path: Path, monkeypatch, value: str) -> None:
    monkeypatch.setenv(COPY_LIMIT, value)
    (tmp_path / "train.py").write_text(BROKEN)
    with pytest.raises(CliUsageError, match=f"{COPY_LIMIT}=.* is not a size: .* e.g. {COPY_LIMIT}=8G"):
        Workspace(str(tmp_path), "train.py", [], None)


def test_fix_in_a_folder_over_the_limit_exits_2_with_one_line_and_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(BROKEN)
    sparse(tmp_path / "ckpt" / "last.pt", 1 << 20)
    env = {**os.environ, "NO_COLOR": "1", COPY_LIMIT: "512K"}
    done = subprocess.run([sys.executable, "-m", "inplace_doctor", "fix", "--force", "train.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "ckpt/ 1.00 MiB" in lines[0] and "Traceback" not in done.stderr, done.stderr
    assert (tmp_path / "train.py").read_text() == BROKEN
