"""Proofs that prove (issue 38, items 1, 2 and 4): "proven" only from runs that reached the finding's
line and the edited one, of an intended program that ran to its end; compared on what the program
prints and writes as well as its values; and no proof run writes a byte outside its copy.

Each program below is of a shape users write: a script that skips its training when its marker
exists, one that logs to an absolute path, one that prints a statistic of its caller's data, one
that saves a checkpoint. Run through `inplace-doctor fix` (and `run --prove`) as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from programs import git_project

pytestmark = pytest.mark.slow

# A training step with a fixable IPD101 (a clone before `h[0] = 0` is proven on it).
STEP = """\
torch.manual_seed(0)
w = torch.randn(4, requires_grad=True)
for _ in range(2):
    h = torch.sigmoid(w)
    h[0] = 0
    h.sum().backward()
"""


# IPD106: a model that writes into its caller's batch; a statistic of the batch follows (a test adds it)
CLIP = textwrap.dedent(
    """\
        import torch
        from torch import nn


        class Clip(nn.Module):
            def forward(self, x):
                x[x < 0] = 0
                return x * 2


        torch.manual_seed(0)
        batch = torch.randn(8, 8)
        out = Clip()(batch)
    """
)


def fix(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inplace_doctor", "fix", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_a_script_that_skips_its_work_when_its_marker_exists_proves_nothing(tmp_path: Path) -> None:
    program = "import os\nimport torch\n\nif os.path.exists('done.marker'):\n    print('already trained')\n" \
              "    raise SystemExit(0)\nopen('done.marker', 'w').close()\n" + STEP + "print('trained')\n"
    project = git_project(tmp_path, {"train.py": program})
    done = fix("train.py", cwd=project)  # its watched run writes the marker: every copy holds it
    assert (project / "done.marker").exists()
    assert done.returncode == 1, done.stdout + done.stderr
    assert not any(line.startswith("fixed") or "(proven" in line for line in done.stdout.splitlines())
    assert ("nothing was proven: the intended program, run in a copy of the project, never ran train.py:12 (the "
            "finding's line)") in done.stdout, done.stdout
    assert (project / "train.py").read_text() == program


def test_without_the_marker_the_same_fix_is_proven(tmp_path: Path) -> None:
    # the control: the same program whose copies do the work gets its fix
    program = "import torch\n\n" + STEP + "print('trained')\n"
    project = git_project(tmp_path, {"train.py": program})
    done = fix("train.py", cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fixed IPD101 at train.py:7: insert `h = h.clone()` at train.py:7 (proven:" in done.stdout, done.stdout


def test_a_proof_run_writes_nothing_outside_its_copy_and_says_the_fix_is_not_provable(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    log = outside / "train.log"
    program = (f"import torch\n\nwith open({str(log)!r}, 'a') as f:\n    f.write('started\\n')\n" + STEP
               + f"with open({str(log)!r}, 'a') as f:\n    f.write('trained\\n')\n")
    (tmp_path / "project").mkdir()
    project = git_project(tmp_path / "project", {"train.py": program})
    done = fix("train.py", cwd=project)
    assert done.returncode == 1, done.stdout + done.stderr
    assert log.read_text() == "started\n"  # the watched run's own line (it stopped at the error); no check's
    assert f"not provable: the intended program writes to {log}, outside the project" in done.stdout + done.stderr
    assert "fixed" not in done.stdout and (project / "train.py").read_text() == program
    proved = subprocess.run([sys.executable, "-m", "inplace_doctor", "run", "--prove", "--format", "json", "train.py"],
                            cwd=project, capture_output=True, text=True, timeout=600)
    assert log.read_text() == "started\nstarted\n", log.read_text()  # run's own run only, never a check's
    data = json.loads(proved.stderr[proved.stderr.index("{\n") : proved.stderr.rindex("}") + 1])
    assert all(fx["applicability"] != "proven" for f in data["findings"] for fx in f["fixes"])


def test_a_program_the_script_starts_is_refused_in_a_proof_and_named(tmp_path: Path) -> None:
    program = "import subprocess\nimport torch\n\nsubprocess.run(['true'])\n" + STEP
    project = git_project(tmp_path, {"train.py": program})
    done = fix("train.py", cwd=project)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "starts another program (`true`), whose writes a proof cannot keep inside its copy" in done.stdout + done.stderr


def test_a_fix_that_changes_what_the_script_prints_is_not_proven_and_says_the_line(tmp_path: Path) -> None:
    # IPD106: the model writes into its caller's batch; the clone stops it, and the caller's printed
    # statistic changes: that is the fix's purpose, said in the line that reports it, never "proven".
    program = CLIP + 'print("negatives left in batch:", int((batch < 0).sum()))\n'
    project = git_project(tmp_path, {"clip.py": program})
    done = fix("clip.py", cwd=project)
    assert done.returncode == 1, done.stdout + done.stderr
    assert ("its standard output differs: line 1 reads `negatives left in batch: 29` where the intended program "
            "printed `negatives left in batch: 0`") in done.stdout, done.stdout
    unsafe = fix("--unsafe-fixes", "clip.py", cwd=project)
    [line] = [x for x in unsafe.stdout.splitlines() if x.startswith("fixed ")]
    assert "unsafe, applied by --unsafe-fixes" in line and "that difference is the fix's purpose" in line, line


def test_a_file_the_script_writes_differently_is_a_difference(tmp_path: Path) -> None:
    # the same caller-data fix, its statistic written to a file in the project instead of printed:
    # the output and every recorded value agree, the file does not
    program = CLIP + 'with open("stats.txt", "w") as f:\n    f.write(str(int((batch < 0).sum())))\n'
    project = git_project(tmp_path, {"clip.py": program})
    done = fix("clip.py", cwd=project)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "it wrote stats.txt with other bytes than the intended program" in done.stdout, done.stdout
    assert (project / "stats.txt").read_text() == "0"  # the watched run's, in the project: the user's own run
