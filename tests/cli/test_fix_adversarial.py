"""What `inplace-doctor fix` writes into the user's tree, attacked: line endings and encodings at the
edges of a file, patches other tools must apply, owners and modes, files that are not what they
seem, and findings that share a line. Every byte outside an edit is the user's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from inplace_doctor.cli.proof.source_edits import Source, apply_to_source, plan, unified_diff, write_all
from inplace_doctor.findings import Edit, Fix, Position

P = Position


def git(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, capture_output=True)


# --- the engine: bytes at the edges of a file ---------------------------------------------------------


@pytest.mark.parametrize("ending", [b"\r\n", b"\r", b"\n"])
def test_a_line_inserted_before_a_last_line_without_an_ending_takes_the_files_ending(ending: bytes) -> None:
    data = ending.join([b"import torch", b"h = torch.ones(2)", b"h.mul_(2)"])  # no ending after the last line
    out = apply_to_source("m.py", Source.of(data, "m.py"), [Edit("m.py", P(3, 0), P(3, 0), "", "h = h.clone()\n")])
    assert out == ending.join([b"import torch", b"h = torch.ones(2)", b"h = h.clone()", b"h.mul_(2)"])


def test_a_file_of_one_line_without_an_ending_gets_lf() -> None:
    out = apply_to_source("m.py", Source.of(b"x = 1", "m.py"), [Edit("m.py", P(1, 0), P(1, 0), "", "y = 2\n")])
    assert out == b"y = 2\nx = 1"


@pytest.mark.parametrize("ending", [b"\r\n", b"\n"])
@pytest.mark.parametrize("last", [b"", b"\n"], ids=["no-final-ending", "final-lf"])
def test_the_diff_of_a_file_applies_with_git_apply_and_gives_the_bytes_fix_writes(
    tmp_path: Path, ending: bytes, last: bytes
) -> None:
    data = ending.join([b"import torch", b"h = torch.ones(2)", b"h.mul_(2)"]) + (ending if last else b"")
    (tmp_path / "m.py").write_bytes(data)
    changes = plan([Edit("m.py", P(3, 0), P(3, 9), "h.mul_(2)", "h = h.mul(2)")], str(tmp_path))
    patch = unified_diff(changes, str(tmp_path))
    assert (tmp_path / "m.py").read_bytes() == data  # planning and the diff write nothing
    git("init", "-q", cwd=tmp_path)
    (tmp_path / "fix.patch").write_bytes(patch)
    applied = git("apply", "fix.patch", cwd=tmp_path)
    assert applied.returncode == 0, (patch, applied.stderr)
    [(_, after)] = changes.values()
    assert (tmp_path / "m.py").read_bytes() == after == data.replace(b"h.mul_(2)", b"h = h.mul(2)")


def test_the_diff_keeps_a_lone_cr_inside_its_line(tmp_path: Path) -> None:
    data = b"a = 1\rb = 2\rh = 3\n"  # classic Mac line ends: one line for git and patch
    (tmp_path / "m.py").write_bytes(data)
    changes = plan([Edit("m.py", P(2, 0), P(2, 5), "b = 2", "b = 4")], str(tmp_path))
    patch = unified_diff(changes, str(tmp_path))
    git("init", "-q", cwd=tmp_path)
    (tmp_path / "fix.patch").write_bytes(patch)
    assert git("apply", "fix.patch", cwd=tmp_path).returncode == 0, patch
    assert (tmp_path / "m.py").read_bytes() == b"a = 1\rb = 4\rh = 3\n"


def test_the_diff_names_a_file_whose_name_is_not_utf8_by_its_bytes(tmp_path: Path) -> None:
    name = os.fsdecode(b"caf\xff.py")
    (tmp_path / name).write_bytes(b"x = 1\n")
    patch = unified_diff(plan([Edit(name, P(1, 4), P(1, 5), "1", "2")], str(tmp_path)), str(tmp_path))
    assert patch.startswith(b"--- a/caf\xff.py\n+++ b/caf\xff.py\n")


# --- the write: what the file was, beside its bytes -----------------------------------------------------


def test_a_written_file_keeps_its_mode_bits(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text("x = 1\n")
    path.chmod(0o751)
    write_all(plan([Edit("train.py", P(1, 4), P(1, 5), "1", "2")], str(tmp_path)))
    assert path.read_text() == "x = 2\n" and (path.stat().st_mode & 0o7777) == 0o751
    assert sorted(os.listdir(tmp_path)) == ["train.py"]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="only root can make a file someone else's")
def test_root_editing_a_users_file_leaves_it_the_users(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text("x = 1\n")
    os.chown(path, 65534, 65534)
    write_all(plan([Edit("train.py", P(1, 4), P(1, 5), "1", "2")], str(tmp_path)))
    info = path.stat()
    assert path.read_text() == "x = 2\n" and (info.st_uid, info.st_gid) == (65534, 65534)


def test_a_symlinked_file_is_written_through_and_the_link_stays(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    real = tmp_path / "real" / "train.py"
    real.write_text("x = 1\n")
    (tmp_path / "train.py").symlink_to("real/train.py")
    write_all(plan([Edit("train.py", P(1, 4), P(1, 5), "1", "2")], str(tmp_path)))
    assert (tmp_path / "train.py").is_symlink() and os.readlink(tmp_path / "train.py") == "real/train.py"
    assert real.read_text() == "x = 2\n"


# --- the scratch copy fixes are checked in leads nowhere back into the user's files ------------------


def test_the_copys_links_name_the_copy_inside_the_project_and_the_same_place_outside(tmp_path: Path) -> None:
    from inplace_doctor.cli.proof.prove import Workspace

    project, outside = tmp_path / "project", tmp_path / "datasets"
    (project / "runs").mkdir(parents=True)
    outside.mkdir()
    (project / "train.py").write_text("x = 1\n")
    (project / "ckpt").symlink_to(project / "runs")  # absolute, inside the project
    (project / "here").symlink_to("runs")  # relative, inside
    (project / "data").symlink_to("../datasets")  # relative, outside
    ws = Workspace(str(project), "train.py", [], None)
    try:
        base = Path(ws.base)
        assert (base / "ckpt").resolve() == (base / "runs").resolve()
        assert os.readlink(base / "here") == "runs"
        assert (base / "data").resolve() == outside.resolve()
    finally:
        ws.close()
    assert os.readlink(project / "ckpt") == str(project / "runs")  # the user's links as they were


def test_a_named_pipe_or_a_socket_in_the_project_is_not_copied(tmp_path: Path) -> None:
    import socket

    from inplace_doctor.cli.proof.prove import Workspace

    (tmp_path / "train.py").write_text("x = 1\n")
    os.mkfifo(tmp_path / "pipe")  # copying it would block, or fail as a special file
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock"))
    try:
        ws = Workspace(str(tmp_path), "train.py", [], None)
        assert sorted(os.listdir(ws.base)) == ["train.py"]
        ws.close()
    finally:
        server.close()


def test_a_project_that_cannot_be_copied_is_one_usage_line_and_no_scratch_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file the user cannot read (as root there is none: copytree's own error, as it raises it)."""
    import shutil
    import tempfile

    from inplace_doctor.cli.errors import CliUsageError
    from inplace_doctor.cli.proof.prove import Workspace

    (tmp_path / "train.py").write_text("x = 1\n")
    secret = str(tmp_path / "secret.txt")

    def copytree(src: str, dst: str, **kw: object) -> None:
        os.makedirs(dst)
        raise shutil.Error([(secret, os.path.join(dst, "secret.txt"), f"[Errno 13] Permission denied: {secret!r}")])

    monkeypatch.setattr(shutil, "copytree", copytree)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with pytest.raises(CliUsageError, match=r"cannot copy the project to check the fixes on: \[Errno 13\] "
                                             r"Permission denied: .*secret.txt' \(secret.txt\)$"):
        Workspace(str(tmp_path), "train.py", [], None)
    assert os.listdir(scratch) == []


def test_a_read_only_file_is_refused_even_for_root_and_shown_with_diff(tmp_path: Path) -> None:
    import argparse

    from inplace_doctor.cli.errors import CliUsageError
    from inplace_doctor.cli.fix import _refuse

    path = tmp_path / "train.py"
    path.write_text("x = 1\n")
    path.chmod(0o444)
    # (for a user other than root the file is not writable, and that refusal comes first)
    with pytest.raises(CliUsageError, match=r"train.py is (read-only \(mode 0444\): fix changes no file|not writable)"):
        _refuse(argparse.Namespace(diff=False, force=True), str(tmp_path), {str(path)})
    _refuse(argparse.Namespace(diff=True, force=True), str(tmp_path), {str(path)})  # --diff writes nothing


# --- git's checks say what git said ---------------------------------------------------------------------


def refusal(path: Path) -> str:
    from inplace_doctor.cli.errors import CliUsageError
    from inplace_doctor.cli.fix import _refuse_uncommitted

    with pytest.raises(CliUsageError) as info:
        _refuse_uncommitted(str(path))
    return str(info.value)


def test_a_file_in_no_repository_is_refused_with_gits_reason(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("x = 1\n")
    said = refusal(tmp_path / "train.py")
    assert "git cannot say whether" in said and "not a git repository" in said, said


def test_a_file_untracked_or_changed_in_a_repository_is_refused_as_such(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("x = 1\n")
    git("init", "-q", cwd=tmp_path)
    assert "train.py is not committed to git" in refusal(tmp_path / "train.py")
    git("add", "train.py", cwd=tmp_path)  # staged, and the repository has no commit yet
    assert "git cannot say whether" in refusal(tmp_path / "train.py")
    git("commit", "-qm", "start", cwd=tmp_path)
    (tmp_path / "train.py").write_text("x = 2\n")
    assert "train.py has uncommitted changes" in refusal(tmp_path / "train.py")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="root reading another user's repository")
def test_a_repository_git_will_not_read_is_not_called_uncommitted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)  # no safe.directory of this machine's
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    (tmp_path / "train.py").write_text("x = 1\n")
    git("init", "-q", cwd=tmp_path)
    git("add", ".", cwd=tmp_path)
    git("commit", "-qm", "start", cwd=tmp_path)
    for folder, dirs, files in os.walk(tmp_path):
        for name in (".", *dirs, *files):
            os.lchown(os.path.join(folder, name), 65534, 65534)
    said = refusal(tmp_path / "train.py")
    assert "dubious ownership" in said and "not committed" not in said, said


# --- the edit a flag finding carries: the constructor as the user wrote it ---------------------------


def flag_fix_of(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, constructed: str) -> tuple[Path, Fix]:
    """The one IPD101 of a sigmoid's output overwritten by the module `constructed` builds (watched
    in this process), and its first fix."""
    import runpy

    import inplace_doctor as ipd
    from inplace_doctor import Severity

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "program.py"
    path.write_text(
        "import torch\nfrom torch import nn\ntorch.manual_seed(0)\n"
        f"model = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid(), {constructed})\n"
        "out = model(torch.randn(3, 4))\nout.sum().backward()\n"
    )
    session = ipd.watch()
    with pytest.raises(RuntimeError), session:
        runpy.run_path(str(path), run_name="__main__")
    [finding] = [f for f in session.report().findings if f.severity is not Severity.INFO]
    return path, finding.fixes[0]


@pytest.mark.parametrize(("constructed", "fixed"), [
    ("nn.ReLU(True)", "nn.ReLU(False)"),
    ("nn.Hardtanh(0.0, 0.9, True)", "nn.Hardtanh(0.0, 0.9, False)"),
    ("nn.ReLU(\n    inplace=True,\n)", "nn.ReLU(\n    inplace=False,\n)"),
    ("nn.ReLU(True), nn.Dropout(0.0, True)", "nn.ReLU(False), nn.Dropout(0.0, True)"),
], ids=["positional", "positional-third", "over-lines", "beside-another-module"])
def test_a_constructor_flag_passed_by_position_or_over_lines_is_turned_off_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, constructed: str, fixed: str
) -> None:
    from inplace_doctor.findings import Applicability, FixKind

    path, fix = flag_fix_of(tmp_path, monkeypatch, constructed)
    assert (fix.kind, fix.applicability) == (FixKind.FLAG_OFF_AT_CONSTRUCTOR, Applicability.UNSAFE), fix
    before = path.read_text()
    write_all(plan(fix.edits, str(tmp_path)))
    assert path.read_text() == before.replace(constructed, fixed)


def test_two_flags_on_the_constructors_line_leave_the_fix_manual(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from inplace_doctor.findings import FixKind

    _, fix = flag_fix_of(tmp_path, monkeypatch, "nn.ReLU(True), nn.Sigmoid(), nn.ReLU(True)")
    assert (fix.kind, fix.edits) == (FixKind.FLAG_OFF_AT_CONSTRUCTOR, ())  # which one ran is not known


# --- what fix says it changed, for a statement over several lines ---------------------------------------


@pytest.mark.parametrize(("code", "shown"), [
    ("h.mul_(\n    2,\n)", "h.mul_(2,)"),
    ("h \\\n    .mul_(2)", "h.mul_(2)"),
    ("y = (a +  # the sum\n     b)", "y = (a + b)"),
    ("value = x\n    buf = buf.clone()\n    buf[4] = value", "value = x; buf = buf.clone(); buf[4] = value"),
])
def test_a_statement_over_several_lines_is_described_as_python_reads_it(tmp_path: Path, code: str, shown: str) -> None:
    from inplace_doctor.cli.proof.fix_search import describe
    from inplace_doctor.render.code_text import one_line

    assert one_line(code) == shown
    (tmp_path / "m.py").write_text(f"if True:\n    {code}\n")
    end = P(1 + code.count("\n") + 1, len(code.splitlines()[-1]) if code.count("\n") else 4 + len(code))
    edit = Edit(str(tmp_path / "m.py"), P(2, 4), end, code, "pass")
    assert describe((edit,), str(tmp_path), plan([edit], str(tmp_path))) == f"replace `{shown}` with `pass` at m.py:2"


# --- two writes on one line ------------------------------------------------------------------------------


def fixes_of_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str) -> list[tuple[str, ...]]:
    """The (old, new) of every edit of each error or warning finding of a program with `line` between
    the forward (h = sigmoid(w), g = tanh(w)) and the backward."""
    import runpy

    import inplace_doctor as ipd
    from inplace_doctor import Severity

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "program.py"
    path.write_text("import torch\nimport torch.nn.functional as F\ntorch.manual_seed(0)\nw = torch.randn(4, requires_grad=True)\n"
                    f"h = torch.sigmoid(w)\ng = torch.tanh(w)\n{line}\n(h * g).sum().backward()\n")
    session = ipd.watch()
    with pytest.raises(RuntimeError), session:
        runpy.run_path(str(path), run_name="__main__")
    found = [f for f in session.report().findings if f.severity is not Severity.INFO]
    assert found
    return sorted(tuple(x for fx in f.fixes for e in fx.edits for x in (e.old, e.new)) for f in found)


def test_each_of_two_writes_on_one_line_gets_the_edit_of_its_own_statement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert fixes_of_each(tmp_path, monkeypatch, "h.mul_(2); g.add_(3)") == [
        ("g.add_(3)", "g = g.add(3)"), ("h.mul_(2)", "h = h.mul(2)")]


def test_two_writes_of_one_op_on_one_line_get_no_edit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # which statement wrote is not known from the line: before, both findings edited the first one
    assert set(fixes_of_each(tmp_path, monkeypatch, "h.mul_(2); g.mul_(3)")) == {()}


@pytest.mark.parametrize(("line", "edit"), [
    ("F.relu_(h)", ("F.relu_(h)", "h = F.relu(h)")),
    ("torch.relu_(h)", ("torch.relu_(h)", "h = torch.relu(h)")),
    ("h.relu_()", ("h.relu_()", "h = h.relu()")),
    ("torch.clamp_(h, 0.2, 0.8)", ("torch.clamp_(h, 0.2, 0.8)", "h = torch.clamp(h, 0.2, 0.8)")),
])
def test_an_inplace_function_of_torch_is_rebound_on_its_argument_never_on_the_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str, edit: tuple[str, str]
) -> None:
    # before: no edit, and the sentence said `F = F.relu(h)`
    assert fixes_of_each(tmp_path, monkeypatch, line) == [edit]


@pytest.mark.parametrize(("encoding", "head", "text"), [
    ("utf-8", "", "🙂 𝔘"),  # characters outside the BMP: one character, four bytes each
    ("latin-1", "# -*- coding: latin-1 -*-\r\n", "é à"),
])
def test_an_edit_after_wide_characters_on_its_line_lands_on_its_statement(
    tmp_path: Path, encoding: str, head: str, text: str
) -> None:
    from inplace_doctor.rules.fixes.fix_builders import write_fixes
    from inplace_doctor.sites import Site

    path = tmp_path / "m.py"
    data = (head + f'import torch\r\nh = torch.ones(2)\r\ntag = "{text}"; h.relu_()  # {text}\r\n').encode(encoding)
    path.write_bytes(data)
    line = 3 + bool(head)
    [fix] = write_fixes(Site(op="aten.relu_", file=str(path), line=line))
    write_all(plan(fix.edits, str(tmp_path)))
    assert path.read_bytes() == data.replace(b"; h.relu_()", b"; h = h.relu()")


def test_a_finding_whose_line_another_fix_rewrote_is_the_one_it_was(tmp_path: Path) -> None:
    from inplace_doctor.cli.proof.edited_lines import renamed, rewritten
    from inplace_doctor.cli.proof.prove import How, Identity, Record, Run, judge
    from inplace_doctor.findings import Finding, Severity
    from inplace_doctor.report import Report
    from inplace_doctor.sites import Site

    before, after = b"x = 1\nh.mul_(2); g.mul_(3)\n", b"x = 1\nh = h.mul(2); g.mul_(3)\n"
    renames = rewritten({str(tmp_path / "t.py"): (before, after)}, str(tmp_path))
    target = Identity("IPD101", "t.py", "h.mul_(2); g.mul_(3)", 2)
    also = frozenset(renamed({target}, renames))
    assert also == {Identity("IPD101", "t.py", "h = h.mul(2); g.mul_(3)", 2)}

    def trial(n: int) -> Run:  # n findings left on the rewritten line, the run stopped by the first
        site = Site(op="aten.mul_", file=str(tmp_path / "t.py"), line=2, code="h = h.mul(2); g.mul_(3)")
        found = [Finding(code="IPD101", severity=Severity.ERROR, title="t", mutation=site)] * n
        return Run(1, Report(found), Record(How.RAISED, "RuntimeError", 0, (("forward", "a", "1"),)), "", str(tmp_path))

    reference = Record(How.RAN, "", 0, (("forward", "a", "1"), ("forward", "b", "2")))
    one_left = judge(target, trial(1), reference, {target} | also, also=also, was=2)
    assert one_left.gone and not one_left.new and one_left.on_the_way  # the other write: known, the next to fix
    both_left = judge(target, trial(2), reference, {target} | also, also=also, was=2)
    assert not both_left.gone  # the edit rewrote the line, and the write is still there


# --- end to end: the command on a real program -------------------------------------------------------


def fix_bytes(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "inplace_doctor", "fix", *args], capture_output=True, timeout=600,
                          cwd=cwd, env={**os.environ, "NO_COLOR": "1"})


def committed(folder: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (folder / name).write_bytes(data)
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-qm", "start"]):
        assert git(*cmd, cwd=folder).returncode == 0
    return folder


# A BOM, CRLF, tabs, a non-ASCII comment on the written line, no ending after the last line.
ODD = ("\ufeff# entraîné à la main\r\nimport torch\r\n\r\nprint('--- a/train.py')\r\ntorch.manual_seed(0)\r\n"
       "w = torch.randn(4, requires_grad=True)\r\nfor _ in range(2):\r\n\th = torch.sigmoid(w)\r\n"
       "\th[0] = 0  # é\r\n\th.sum().backward()\r\nprint(w.grad.tolist())").encode()


@pytest.mark.slow
def test_diff_changes_no_byte_nor_time_and_its_patch_alone_on_stdout_is_what_fix_writes(tmp_path: Path) -> None:
    project = committed(tmp_path, {"train.py": ODD})
    script = project / "train.py"
    stamp = script.stat().st_mtime_ns
    shown = fix_bytes("--diff", "train.py", cwd=project)
    assert shown.returncode == 1, shown.stderr
    assert script.read_bytes() == ODD and script.stat().st_mtime_ns == stamp
    assert git("status", "--porcelain", "--ignored", cwd=project).stdout == b""  # nothing left beside it
    patch = shown.stdout  # the patch alone: the script's output (a line like a patch's) went to stderr
    assert patch.startswith(b"--- a/train.py\n+++ b/train.py\n@@ ") and b"--- a/train.py" in shown.stderr
    want = ODD.replace(b"\th[0] = 0", b"\th = h.clone()\r\n\th[0] = 0")
    (tmp_path.parent / f"{tmp_path.name}.patch").write_bytes(patch)
    assert git("apply", str(tmp_path.parent / f"{tmp_path.name}.patch"), cwd=project).returncode == 0
    assert script.read_bytes() == want
    git("checkout", "--", "train.py", cwd=project)
    done = fix_bytes("train.py", cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert script.read_bytes() == want


@pytest.mark.slow
def test_a_file_changed_while_fix_ran_is_kept_as_changed_and_nothing_is_written(tmp_path: Path) -> None:
    # The user saves the file while fix checks its edit in the copy (a proof run itself can no longer
    # write outside its copy: the test saves it, once fix says it is checking).
    user = tmp_path / "train.py"
    program = (
        b"import torch\n\ntorch.manual_seed(0)\nw = torch.randn(4, requires_grad=True)\nfor _ in range(2):\n"
        b"    h = torch.sigmoid(w)\n    h[0] = 0\n    h.sum().backward()\n"
    )
    committed(tmp_path, {"train.py": program})
    fixing = subprocess.Popen([sys.executable, "-m", "inplace_doctor", "fix", "--force", "train.py"], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"})
    assert fixing.stdout is not None
    said = b""
    for line in fixing.stdout:  # forced past git's check, which would see the change too
        said += line
        if line.startswith(b"inplace-doctor: checking the fix"):
            with open(user, "ab") as f:
                f.write(b"# saved by the user\n")
    out, err = fixing.communicate(timeout=600)
    assert fixing.returncode == 2, said + out + err
    assert err.strip().splitlines()[-1].endswith(b"changed while fix ran; nothing was written: run fix again")
    assert user.read_bytes() == program + b"# saved by the user\n"


@pytest.mark.slow
def test_checks_in_the_copy_write_nothing_through_an_absolute_link_into_the_project(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / ".keep").write_bytes(b"")
    (tmp_path / "ckpt").symlink_to(runs)  # absolute: in a copy it named the user's folder
    program = (
        b"import torch\n\nwith open('ckpt/log.txt', 'a') as f:\n    f.write('ran\\n')\n"
        b"torch.manual_seed(0)\nw = torch.randn(4, requires_grad=True)\nfor _ in range(2):\n"
        b"    h = torch.sigmoid(w)\n    h[0] = 0\n    h.sum().backward()\n"
    )
    committed(tmp_path, {"train.py": program})
    done = fix_bytes("train.py", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (runs / "log.txt").read_text() == "ran\n"  # the watched run's line: none of the checks'


def test_a_comment_is_kept_only_where_nothing_follows_it() -> None:
    from inplace_doctor.render.code_text import one_line

    assert one_line("c_opt.step()  # before the actor's backward\n") == "c_opt.step()  # before the actor's backward"
    assert one_line("x = 1  # one\ny = 2  # two\n") == "x = 1; y = 2  # two"
    assert one_line('x = "#"  # hash\n') == 'x = "#"  # hash'


# --- reports and configs: a path that cannot be written is one line, and nothing is made --------------


@pytest.mark.parametrize(("command", "option"), [("audit", "--output"), ("audit", "--html"), ("optimize", "--write")])
@pytest.mark.parametrize(("named", "said"), [
    ("missing/report.txt", "the folder 'missing' does not exist; create it or name a file in an existing folder"),
    ("notes.txt/report.txt", "'notes.txt' is a file, not a folder; name a file in an existing folder"),
])
def test_a_report_in_a_folder_that_is_not_one_is_refused_in_one_line_and_nothing_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    command: str, option: str, named: str, said: str,
) -> None:
    from inplace_doctor.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine\n")
    assert main([command, "inplace_doctor.examples:sigmoid_then_relu", option, named]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == f"inplace-doctor: error: cannot write {named!r}: {said}", line
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"] and (tmp_path / "notes.txt").read_text() == "mine\n"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
