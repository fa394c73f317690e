"""Proofs of scripts that never seed (issue 37, item 8): every proof run starts from the same seeds.

`fix` and `run --prove` run the user's program several times and compare the runs bit for bit.
Most scripts do not call `torch.manual_seed`; the proof children seed `random`, NumPy, torch and
the hash of strings alike, so only what really differs between two runs (the clock, `os.urandom`,
the network, files) keeps a fix unproven, and `fix` names it. The program's own seeding wins,
and seeding is the proof runs' only: `inplace-doctor run` leaves the program's randomness alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from test_fix import BROKEN_TRAIN, fix_cli, git_project

UNSEEDED_TRAIN = BROKEN_TRAIN.read_text().replace("torch.manual_seed(0)\n", "").replace(
    "for _step in range(1, 21):", "for _step in range(1, 3):")

RANDOM_NUMBERS = textwrap.dedent(
    """\
    import random
    import sys

    import torch

    SEEDED = len(sys.argv) > 1
    if SEEDED:
        torch.manual_seed(123)
        random.seed(7)
    print(torch.rand(3).tolist(), torch.randn(2).tolist())
    print(random.random())
    if "numpy" in sys.modules:
        import numpy

        if SEEDED:
            numpy.random.seed(5)
        print(numpy.random.rand(2).tolist())
    print(hash("a string"))  # last: seeded by PYTHONHASHSEED only
    """
)


def proof_child(folder: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The script run as the reference run of a proof runs it (`Workspace.run`: its environment too)."""
    from inplace_doctor.cli.proof.prove import Workspace

    ws = Workspace(str(folder), "draws.py", [], None)
    try:
        environment = {**ws._environment(str(folder)), **(env or {})}
    finally:
        ws.close()
    argv = [sys.executable, "-m", "inplace_doctor.cli.proof.recorder", "--record", str(folder / "record.json"),
            "--reference", "--", "draws.py", *args]
    done = subprocess.run(argv, cwd=folder, capture_output=True, text=True, env=environment, timeout=300)
    assert done.returncode == 0, done.stderr
    return done


def plain(folder: Path, *command: str) -> str:
    done = subprocess.run([sys.executable, *command], cwd=folder, capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_an_unseeded_training_script_is_fixed_and_the_patch_says_it_is_proven(tmp_path: Path) -> None:
    project = git_project(tmp_path, {"train.py": UNSEEDED_TRAIN})
    shown = fix_cli("--diff", "train.py", cwd=project)
    assert shown.returncode == 1, shown.stderr
    assert "seed" not in shown.stderr, shown.stderr
    # stdout is the patch alone, as git takes it; whether it is proven is on stderr
    assert "inplace-doctor: the patch on stdout is proven (nothing was written)" in shown.stderr, shown.stderr
    assert ("in the patch: IPD101 at train.py:19: insert `feats = feats.clone()` at train.py:19 (proven: the finding "
            "is gone") in shown.stderr
    (project / "fix.patch").write_text(shown.stdout)
    check = subprocess.run(["git", "apply", "--check", "fix.patch"], cwd=project, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert (project / "train.py").read_text() == UNSEEDED_TRAIN

    done = fix_cli("train.py", cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fixed IPD101 at train.py:19: insert `feats = feats.clone()` at train.py:19 (proven:" in done.stdout
    assert "        feats = feats.clone()\n        feats[:, 32 - pad:] = 0" in (project / "train.py").read_text()


def test_a_script_that_reads_the_clock_stays_unproven_and_fix_names_the_line(tmp_path: Path) -> None:
    clocked = UNSEEDED_TRAIN.replace("import torch\n", "import time\n\nimport torch\n", 1).replace(
        "x, y = torch.randn(64, 16),", "x, y = torch.randn(64, 16) * (time.time() % 1 + 1),")
    project = git_project(tmp_path, {"train.py": clocked})
    line = clocked.splitlines().index(next(s for s in clocked.splitlines() if "time.time()" in s)) + 1
    done = fix_cli("train.py", cwd=project)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "fixed" not in done.stdout and (project / "train.py").read_text() == clocked
    assert ("but the intended program itself does not compute the same values twice from the same seeds (forward "
            "of model (Tagger): call 1: output 0 differs between two runs of it): it reads what seeds do not fix: the clock "
            f"(time.time at train.py:{line}), so no edit can be proven equal to it") in done.stdout, done.stdout
    assert "does the script seed" not in done.stdout


def test_proof_runs_start_from_the_same_seeds_and_the_programs_own_seeds_win(tmp_path: Path) -> None:
    (tmp_path / "draws.py").write_text(RANDOM_NUMBERS)
    first, second = proof_child(tmp_path).stdout, proof_child(tmp_path).stdout
    assert first == second  # torch, random, NumPy and hash(): all alike in two proof runs
    seeded = proof_child(tmp_path, "seeded").stdout.splitlines()
    as_python = plain(tmp_path, "draws.py", "seeded").splitlines()
    assert seeded[:-1] == as_python[:-1]  # the script's own seeds win: its numbers are python's
    assert seeded[0] != first.splitlines()[0]


def test_run_leaves_the_programs_randomness_alone(tmp_path: Path) -> None:
    (tmp_path / "draws.py").write_text(RANDOM_NUMBERS)
    runs = [subprocess.run([sys.executable, "-m", "inplace_doctor", "run", "draws.py"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    assert runs[0].stdout != runs[1].stdout  # fresh entropy each run, as under python
    assert proof_child(tmp_path).stdout not in (runs[0].stdout, runs[1].stdout)


def test_a_proof_run_without_numpy_never_imports_it(tmp_path: Path) -> None:
    hidden = tmp_path / "hidden"
    (hidden / "numpy").mkdir(parents=True)
    (hidden / "numpy" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n")
    (tmp_path / "draws.py").write_text("import sys\nimport torch\nprint(torch.rand(2).tolist(), 'numpy' in sys.modules)\n")
    path = os.pathsep.join([str(hidden), os.environ.get("PYTHONPATH", "")])
    done = proof_child(tmp_path, env={"PYTHONPATH": path})
    assert done.stdout.endswith(" False\n"), done.stdout + done.stderr
