"""`inplace-doctor fix`: the edit a finding names, made with libcst, checked by running the script again."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("libcst")

ROOT = Path(__file__).resolve().parents[2]
BROKEN_TRAIN = ROOT / "examples" / "broken_train.py"


def fix_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inplace_doctor", "fix", *args],
        capture_output=True, text=True, timeout=600, cwd=cwd, env={**os.environ, "NO_COLOR": "1"},
    )


def git_project(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    for cmd in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start"]):
        subprocess.run(["git", *cmd], cwd=tmp_path, check=True, capture_output=True)
    return tmp_path


def test_fix_of_the_bundled_broken_script_makes_the_one_line_edit_and_it_trains_to_the_end(tmp_path: Path) -> None:
    project = git_project(tmp_path, {"broken_train.py": BROKEN_TRAIN.read_text()})
    shown = fix_cli("--diff", "broken_train.py", cwd=project)
    assert shown.returncode == 1, shown.stderr  # a patch to apply: like a finding, not a clean run
    assert (project / "broken_train.py").read_text() == BROKEN_TRAIN.read_text()  # --diff writes nothing
    patch = [line for line in shown.stdout.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert patch == ["+        feats = feats.clone()"]

    done = fix_cli("broken_train.py", cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fixed IPD101: insert `feats = feats.clone()` before `feats[:, 32 - pad:] = 0` at broken_train.py:19" in done.stdout
    assert "after the edit the script ran to the end with no finding" in done.stdout
    assert "final loss" in done.stdout  # the script's own output: it trained all 20 steps
    diff = subprocess.run(["git", "diff", "-U0"], cwd=project, capture_output=True, text=True).stdout
    assert [line for line in diff.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))] == patch
    # The comment on the written line, and every other line, are as they were.
    assert "        feats[:, 32 - pad:] = 0  # zero the padded features\n" in (project / "broken_train.py").read_text()


AUGMENTED_AND_FLAG = textwrap.dedent(
    """\
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.gate = nn.Sigmoid()
            self.act = nn.ReLU(inplace=True)  # on the sigmoid's output, which backward needs

        def forward(self, x):
            h = self.gate(self.fc(x))
            return self.act(h)


    def score(x, w):
        s = torch.tanh(x @ w)
        s += 1  # shift: overwrites what TanhBackward0 saved
        return s.sum()


    torch.manual_seed(0)
    net, w = Net(), torch.randn(4, 4, requires_grad=True)
    opt = torch.optim.SGD([*net.parameters(), w], lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        loss = net(torch.randn(2, 4)).sum() + score(torch.randn(2, 4), w)
        loss.backward()
        opt.step()
    print("done", round(loss.item(), 4))
    """
)


def test_fix_rewrites_an_augmented_assignment_and_flips_a_flag_at_its_constructor(tmp_path: Path) -> None:
    project = git_project(tmp_path, {"train.py": AUGMENTED_AND_FLAG})
    done = fix_cli("train.py", cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    # A run stops at the first error backward reaches: the second edit comes from the second run.
    assert "fixed IPD101: replace `s += 1` with `s = s + 1` at train.py:19" in done.stdout
    assert "fixed IPD101: construct with inplace=False at train.py:10" in done.stdout
    assert done.stdout.rstrip().endswith("after the edit the script ran to the end with no finding")
    text = (project / "train.py").read_text()
    assert "    s = s + 1  # shift: overwrites what TanhBackward0 saved\n" in text
    assert "        self.act = nn.ReLU(inplace=False)  # on the sigmoid's output, which backward needs\n" in text
    assert text.count("\n") == AUGMENTED_AND_FLAG.count("\n")
    ran = subprocess.run([sys.executable, "train.py"], capture_output=True, text=True, cwd=project, timeout=300)
    assert ran.returncode == 0 and ran.stdout.startswith("done"), ran.stderr


def test_fix_refuses_a_file_with_uncommitted_changes_unless_forced(tmp_path: Path) -> None:
    project = git_project(tmp_path, {"broken_train.py": BROKEN_TRAIN.read_text()})
    edited = BROKEN_TRAIN.read_text().replace("for step in range(1, 21):", "for step in range(1, 3):")
    (project / "broken_train.py").write_text(edited)
    refused = fix_cli("broken_train.py", cwd=project)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].endswith(
        "broken_train.py has uncommitted changes: commit them first, see the edit with --diff, or pass --force"
    )
    assert (project / "broken_train.py").read_text() == edited
    forced = fix_cli("--force", "broken_train.py", cwd=project)
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "feats = feats.clone()" in (project / "broken_train.py").read_text()


def test_fix_never_edits_a_file_outside_the_project(tmp_path: Path) -> None:
    outside = tmp_path / "lib"
    outside.mkdir()
    shutil.copy(BROKEN_TRAIN, outside / "tagger.py")
    (tmp_path / "project").mkdir()
    project = git_project(tmp_path / "project", {"main.py": "import sys\nsys.path.insert(0, '../lib')\nimport tagger\n"})
    refused = fix_cli("main.py", cwd=project)
    assert refused.returncode == 2
    assert "outside this project" in refused.stderr and "make that change by hand" in refused.stderr
    assert (outside / "tagger.py").read_text() == BROKEN_TRAIN.read_text()


def test_fix_of_a_clean_script_changes_nothing(tmp_path: Path) -> None:
    clean = BROKEN_TRAIN.read_text().replace("feats[:, 32 - pad:] = 0", "feats = feats.clone(); feats[:, 32 - pad:] = 0")
    project = git_project(tmp_path, {"train.py": clean})
    done = fix_cli("train.py", cwd=project)
    assert done.returncode == 0, done.stderr
    assert "nothing to fix" in done.stdout
    assert (project / "train.py").read_text() == clean


FOUR_TEMPLATES = textwrap.dedent(
    """\
    import torch
    import torch.nn.functional as F
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.gate = nn.Sigmoid()
            self.act = nn.ReLU(inplace=True)  # on the sigmoid's output, which backward needs
            self.fc2 = nn.Linear(4, 4)
            self.act2 = nn.ReLU(inplace=True)  # on a Linear's output: safe, and stays

        def forward(self, x):
            h = self.act(self.gate(self.fc(x)))
            t = torch.tanh(self.act2(self.fc2(h)))
            t.mul_(2)
            return F.hardtanh(torch.sigmoid(t), 0.0, 0.6, inplace=True)


    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        loss = net(torch.randn(2, 4)).pow(2).sum()
        loss.backward()
        opt.step()
    print("done", round(loss.item(), 4))
    """
)


def test_fix_flips_flags_rebinds_a_method_statement_and_verify_proves_the_edited_program(tmp_path: Path) -> None:
    project = git_project(tmp_path, {"train.py": FOUR_TEMPLATES})
    done = fix_cli("train.py", cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "fixed IPD101: construct with inplace=False at train.py:11 (`self.act = nn.ReLU(inplace=True)`)" in out
    assert "fixed IPD101: replace `t.mul_(2)` with `t = t.mul(2)` at train.py:18" in out
    assert "fixed IPD101: pass inplace=False at train.py:19" in out
    # After each flag change, the model is verified with the in-place site that stays (act2):
    # a real comparison, not two copies of one out-of-place program.
    verified = [line for line in out.splitlines() if line.startswith("inplace-doctor: verify: `Net`")]
    assert verified and all(
        line.endswith("equivalent: outputs, loss, gradients, buffers and inputs match the out-of-place program "
                      "(1 in-place sites, 2 runs)") for line in verified
    ), verified
    assert out.count("inplace-doctor: proven: as edited, every model the script ran computes exactly") == len(verified)
    assert "the forward computes what it did before the edit" in out
    assert out.rstrip().endswith("after the edit the script ran to the end with no finding")
    text = (project / "train.py").read_text()
    assert "        self.act2 = nn.ReLU(inplace=True)  # on a Linear's output: safe, and stays\n" in text
    assert "        t = t.mul(2)\n" in text
    assert "        return F.hardtanh(torch.sigmoid(t), 0.0, 0.6, inplace=False)\n" in text
    intended = FOUR_TEMPLATES.replace("self.act = nn.ReLU(inplace=True)", "self.act = nn.ReLU(inplace=False)")
    intended = intended.replace("t.mul_(2)", "t = t * 2").replace("0.6, inplace=True", "0.6, inplace=False")
    (project / "intended.py").write_text(intended)
    ran, meant = (
        subprocess.run([sys.executable, name], capture_output=True, text=True, cwd=project, timeout=300)
        for name in ("train.py", "intended.py")
    )
    assert ran.returncode == 0 and ran.stdout == meant.stdout and ran.stdout.startswith("done"), ran.stderr


def test_a_flag_that_changed_the_forward_is_flipped_and_fix_says_the_results_change(tmp_path: Path) -> None:
    residual = AUGMENTED_AND_FLAG.replace("return self.act(h)", "return self.act(h) + h")
    residual = residual.replace("self.gate = nn.Sigmoid()", "self.gate = nn.Identity()")
    project = git_project(tmp_path, {"train.py": residual})
    done = fix_cli("train.py", cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fixed IPD105: construct with inplace=False at train.py:10" in done.stdout
    assert "inplace-doctor: proven: as edited" in done.stdout
    assert "this changes what the forward computes: before the edit a later op read the values" in done.stdout


def test_a_functional_flag_outside_any_module_is_flipped_but_not_called_proven(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """\
        import torch
        import torch.nn.functional as F

        torch.manual_seed(0)
        w = torch.randn(4, requires_grad=True)
        h = F.hardtanh(torch.sigmoid(w), 0.0, 0.6, inplace=True)
        h.sum().backward()
        print("done")
        """
    )
    project = git_project(tmp_path, {"train.py": script})
    done = fix_cli("train.py", cwd=project)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "fixed IPD101: pass inplace=False at train.py:6" in done.stdout
    assert done.stderr.strip().splitlines()[-1] == (
        "inplace-doctor: the flag change is not proven: no model ran while the script was watched; the edit is "
        "kept (`git diff` shows it)"
    )
    assert "inplace=False)" in (project / "train.py").read_text()


def test_an_augmented_assignment_to_an_attribute_is_a_suggestion_not_an_edit() -> None:
    from inplace_doctor.cli.source_edits import edit_for

    at = "at train.py:9"
    assert edit_for({"code": "IPD101", "fix": f"replace `s += 1` with `s = s + 1` {at}"}).kind == "augmented"
    # `self.w = self.w + d` would assign a plain tensor over a Parameter (TypeError) or replace a buffer
    assert edit_for({"code": "IPD101", "fix": f"replace `self.w += d` with `self.w = self.w + d` {at}"}) is None
    rebind = "use the out-of-place `mul` and rebind the name: replace `t.mul_(2)` with `t = t.mul(2)`"
    assert edit_for({"code": "IPD101", "fix": f"{rebind} {at}"}).kind == "rebind"
    dotted = "use the out-of-place `mul` and rebind the name: replace `self.t.mul_(2)` with `self.t = self.t.mul(2)`"
    assert edit_for({"code": "IPD101", "fix": f"{dotted} {at}"}) is None
