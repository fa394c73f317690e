"""The files a command writes destroy nothing (issue 24, items 1-7): a report replaces only an
earlier report of the tool's, recognised by structure; output paths are fixed before the user's
code runs; a file the run wrote is kept; pipes and devices are never read; two options never
name one file; an unwritable folder fails before the work; writes are atomic."""

from __future__ import annotations

import os
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.cli.main import main
from inplace_doctor.cli.provenance import is_report
from inplace_doctor.errors import UsageError

BROKEN = "inplace_doctor.examples:sigmoid_then_relu"
SRC = str(Path(__file__).resolve().parents[2] / "src")


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def usage_line(capsys, *argv: str) -> str:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2, (code, err)
    [line] = err.splitlines()
    assert line.startswith("inplace-doctor: error: ") and "Traceback" not in err
    return line


def _limited() -> None:
    """A child that reads without bound dies of its memory limit, not the machine's."""
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


def run_child(*argv: str, cwd: Path | None = None, timeout: int = 300, **kw) -> subprocess.CompletedProcess[str]:
    """The CLI in a child process: a command that would block or read forever is cut off by the
    timeout or the memory limit instead of hanging the suite."""
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run([sys.executable, "-m", "inplace_doctor", *argv], cwd=cwd, env=env, text=True,
                          timeout=timeout, preexec_fn=_limited, **kw)


# --- 1. a report is recognised by what only a report has, and only in a regular file ---------------

FILES_THAT_NAME_THE_TOOL = {
    "pyproject.toml": '[project]\nname = "mine"\ndependencies = ["torch", "inplace-doctor>=0.1"]\n',
    "train.py": '"""Train the model; check it with `inplace-doctor run train.py`."""\nprint("training")\n',
    "inplace.toml": '# inplace-doctor in-place config for my model\n[inplace]\n"act" = false  # hand edit: keep\n',
    "notes.json": '{"tool": "inplace-doctor", "why": "my notes about the tool"}\n',
    "notes.md": "inplace-doctor audit of my model\n\nwhat I learnt from it\n",
}


GOLDEN = Path(__file__).resolve().parents[1] / "render" / "golden"


@pytest.mark.parametrize("path", sorted(p for p in GOLDEN.iterdir() if p.suffix in (".txt", ".json", ".sarif")),
                         ids=lambda p: p.name)
def test_every_golden_report_is_recognised_as_one(path):
    assert is_report(path.read_bytes())
    assert not is_report(path.read_bytes()[:-200])  # a report cut short is not one: its end is missing


@pytest.mark.parametrize("option", ["--output", "--html"])
@pytest.mark.parametrize("name", sorted(FILES_THAT_NAME_THE_TOOL))
def test_a_file_that_names_the_tool_is_not_taken_for_a_report(capsys, tmp_path, name, option):
    path = tmp_path / name
    path.write_text(FILES_THAT_NAME_THE_TOOL[name], encoding="utf-8")
    line = usage_line(capsys, "audit", BROKEN, option, str(path))
    assert "not a report of inplace-doctor's" in line and "--force" in line
    assert path.read_text(encoding="utf-8") == FILES_THAT_NAME_THE_TOOL[name]


def test_an_earlier_report_is_replaced_in_every_format(capsys, tmp_path):
    for fmt in ("text", "json", "sarif"):
        path = tmp_path / f"report.{fmt}"
        for _ in range(2):  # the second run replaces the first one's report without --force
            assert run_cli(capsys, "audit", BROKEN, "--format", fmt, "--output", str(path))[0] == 1
        assert is_report(path.read_bytes())
    page = tmp_path / "report.html"
    for _ in range(2):
        assert run_cli(capsys, "audit", BROKEN, "--html", str(page))[0] == 1
    assert '<meta name="generator" content="inplace-doctor ' in page.read_text(encoding="utf-8")


def test_a_symbolic_link_is_not_replaced_nor_written_through_without_force(capsys, tmp_path):
    target = tmp_path / "train.py"
    target.write_text(FILES_THAT_NAME_THE_TOOL["train.py"], encoding="utf-8")
    link = tmp_path / "report.txt"
    link.symlink_to(target)
    line = usage_line(capsys, "audit", BROKEN, "--output", str(link))
    assert "symbolic link" in line and "--force" in line
    assert target.read_text(encoding="utf-8") == FILES_THAT_NAME_THE_TOOL["train.py"] and link.is_symlink()
    # A link to an earlier report is not a regular file either; --force writes through it, the link stays.
    report = tmp_path / "real.txt"
    assert run_cli(capsys, "audit", BROKEN, "--output", str(report))[0] == 1
    link.unlink()
    link.symlink_to(report)
    assert "symbolic link" in usage_line(capsys, "audit", BROKEN, "--output", str(link))
    assert run_cli(capsys, "audit", BROKEN, "--output", str(link), "--force")[0] == 1
    assert link.is_symlink() and os.readlink(link) == str(report) and is_report(report.read_bytes())


# --- 2. output paths are fixed before the user's code runs -------------------------------------------


def test_run_writes_a_relative_output_where_it_was_named_when_the_script_changes_directory(capsys, tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "report.json").write_text("my own report.json: keep\n", encoding="utf-8")
    script = tmp_path / "train.py"
    script.write_text(f"import os\nos.chdir({str(elsewhere)!r})\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "run", "--format", "json", "--output", "report.json", "train.py")
    assert code == 0, err
    assert (elsewhere / "report.json").read_text(encoding="utf-8") == "my own report.json: keep\n"
    assert is_report((tmp_path / "report.json").read_bytes())


def test_audit_writes_relative_outputs_where_they_were_named_when_the_factory_changes_directory(capsys, tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "page.html").write_text("<p>my page</p>\n", encoding="utf-8")
    (tmp_path / "moving_factory.py").write_text(
        "import os\nfrom inplace_doctor.examples import sigmoid_then_relu\n\n"
        f"def make():\n    os.chdir({str(elsewhere)!r})\n    return sigmoid_then_relu()\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert run_cli(capsys, "audit", "moving_factory:make", "--html", "page.html")[0] == 1
    assert (elsewhere / "page.html").read_text(encoding="utf-8") == "<p>my page</p>\n"
    assert is_report((tmp_path / "page.html").read_bytes())


# --- 3. a file the run wrote after the check is kept ------------------------------------------------


@pytest.mark.parametrize("earlier_report", [False, True], ids=["new", "earlier-report"])
def test_run_output_never_replaces_a_file_the_script_wrote_during_the_run(capsys, tmp_path, earlier_report):
    out = tmp_path / "results.txt"
    if earlier_report:
        assert run_cli(capsys, "audit", BROKEN, "--output", str(out))[0] == 1
    script = tmp_path / "train.py"
    script.write_text(f"open({str(out)!r}, 'w').write('results of the training run\\n')\n", encoding="utf-8")
    line = usage_line(capsys, "run", "--output", str(out), str(script))
    assert "while the command ran" in line and "--output" in line
    assert out.read_text(encoding="utf-8") == "results of the training run\n"


# --- 4. pipes and devices are never read; regular files are read with a limit --------------------


def test_output_dev_stdout_into_a_pipe_writes_the_report_there():
    done = run_child("audit", BROKEN, "--output", "/dev/stdout", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith(f"inplace-doctor audit of {BROKEN}") and is_report(done.stdout.encode())


def test_a_fifo_nothing_reads_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    done = run_child("audit", BROKEN, "--output", str(fifo), capture_output=True)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert "named pipe" in line and "nothing is reading it" in line


def test_a_fifo_with_a_reader_gets_the_report(tmp_path):
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # open before the write; the report fits the pipe's buffer
    try:
        done = run_child("audit", BROKEN, "--output", str(fifo), capture_output=True)
        got = os.read(reader, 1 << 16)
    finally:
        os.close(reader)
    assert done.returncode == 1, done.stderr[-2000:]
    assert got.startswith(b"inplace-doctor audit of") and stat.S_ISFIFO(os.stat(fifo).st_mode)


@pytest.mark.parametrize("config", ["/dev/zero", "fifo"])
def test_a_config_that_is_a_device_or_a_pipe_is_refused_unread(tmp_path, config):
    if config == "fifo":
        config = str(tmp_path / "inplace.toml")
        os.mkfifo(config)
    done = run_child("audit", BROKEN, "--config", config, capture_output=True)
    assert done.returncode == 2, done.stderr[-2000:]
    [line] = done.stderr.splitlines()
    assert config in line and "not a file" in line


def test_a_config_too_large_to_be_one_is_refused(capsys, tmp_path):
    big = tmp_path / "inplace.toml"
    big.write_bytes(b"# " + b"x" * (5 << 20) + b"\n[inplace]\n")
    assert "larger than 4 MiB" in usage_line(capsys, "audit", BROKEN, "--config", str(big))


def test_optimize_write_to_a_full_device_says_so_in_one_line():
    done = run_child("optimize", BROKEN, "--no-checkpoint", "--steps", "1", "--write", "/dev/full", "--force",
                     capture_output=True)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.splitlines()[-1] == "inplace-doctor: error: cannot write '/dev/full': No space left on device"


def test_plan_write_to_a_device_writes_without_reading_it_and_refuses_a_folder(tmp_path):
    plan = ipd.optimize(nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True)), torch.randn(2, 4), suggest_checkpoint=False)
    assert plan.write("/dev/null", force=True) is None
    with pytest.raises(UsageError, match="is a folder"):
        plan.write(tmp_path, force=True)


# --- 5. two options never name one file --------------------------------------------------------------


def test_output_and_html_naming_the_same_file_is_refused(capsys, tmp_path):
    path = tmp_path / "report"
    line = usage_line(capsys, "audit", BROKEN, "--output", str(path), "--html", str(path))
    assert "--output" in line and "--html" in line and "name the same file" in line
    assert not path.exists()


# --- 6. an unwritable folder fails before the work ---------------------------------------------------


def test_a_folder_that_is_not_writable_fails_before_the_factory_runs():
    """As an unprivileged user (root may write any folder): through `setpriv` when the suite runs as root."""
    root = os.geteuid() == 0
    if root and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: no unprivileged user to find an unwritable folder")
    with tempfile.TemporaryDirectory(prefix="ipd-readonly-") as tmp:
        folder = Path(tmp)
        (folder / "loud_factory.py").write_text(
            "from inplace_doctor.examples import sigmoid_then_relu\n\n"
            "def make():\n    print('FACTORY RAN')\n    return sigmoid_then_relu()\n", encoding="utf-8")
        (folder / "locked").mkdir()
        for path in (folder, folder / "locked"):
            path.chmod(0o555)  # readable and enterable by anyone, writable by nobody but root
        try:
            env = {"PYTHONPATH": f"{SRC}:{folder}", "PATH": os.environ.get("PATH", ""), "HOME": str(folder)}
            if root:  # the checkout and its venv may sit where the unprivileged user cannot read (under /root)
                probe = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                        sys.executable, "-c", "import torch, inplace_doctor"],
                                       env=env, cwd=folder, capture_output=True, text=True, timeout=300)
                if probe.returncode != 0:
                    pytest.skip("the unprivileged user cannot run this interpreter or import the package here "
                                f"(exit {probe.returncode}): {probe.stderr.strip()[-200:]}")
            argv = [sys.executable, "-m", "inplace_doctor", "audit", "loud_factory:make", "--output",
                    str(folder / "locked" / "report.txt")]
            if root:
                argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
            done = subprocess.run(argv, env=env, cwd=folder, capture_output=True, text=True, timeout=300)
        finally:
            folder.chmod(0o755)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "FACTORY RAN" not in done.stdout
    [line] = done.stderr.splitlines()
    assert "the folder" in line and "is not writable" in line


# --- 7. writes are atomic -----------------------------------------------------------------------------


def test_a_replaced_report_is_renamed_into_place_never_rewritten_in_place(capsys, tmp_path):
    path = tmp_path / "report.txt"
    assert run_cli(capsys, "audit", BROKEN, "--output", str(path))[0] == 1
    path.chmod(0o640)
    first = path.read_bytes()
    with open(path, "rb") as old:  # a reader of the old report: it must keep seeing all of it
        assert run_cli(capsys, "audit", BROKEN, "--no-backward", "--output", str(path))[0] == 1
        assert old.read() == first
    assert b"forward only" in path.read_bytes()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # the replaced file's permissions are kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.txt"]  # no temporary file left behind


def test_plan_write_replaces_a_config_by_renaming_it_into_place(tmp_path):
    plan = ipd.optimize(nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True)), torch.randn(2, 4), suggest_checkpoint=False)
    path = tmp_path / "inplace.toml"
    path.write_text("[inplace]\n", encoding="utf-8")
    with open(path, "rb") as old:
        assert plan.write(path, force=True) == "[inplace]\n"
        assert old.read() == b"[inplace]\n"
    assert path.read_text(encoding="utf-8") == plan.toml()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inplace.toml"]
