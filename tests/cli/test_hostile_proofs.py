"""Hostile input to `fix`, `run` and the other commands (issue 38): the script's own exit status, `-`
as an output path, a hard link to an edited file, a script that prints bytes or raises what cannot
print, a full disk, project files that cannot be read, and files python refuses to run. Each is run
through the command line as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from programs import TWO_STEP_TRAIN, git_project

from inplace_doctor.cli.main import main
from inplace_doctor.cli.proof.source_edits import write_all

SRC = str(Path(__file__).resolve().parents[2] / "src")
BROKEN = "inplace_doctor.examples:sigmoid_then_relu"


def cli(*argv: str, cwd: Path, timeout: int = 300, **kw: object) -> subprocess.CompletedProcess[bytes]:
    """`inplace-doctor ARGV` in a child process, its output as bytes; cut off rather than hang."""
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run([sys.executable, "-m", "inplace_doctor", *argv], cwd=cwd, env=env, capture_output=True,
                          timeout=timeout, **kw)  # type: ignore[call-overload]


def python(script: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, script], cwd=cwd, capture_output=True, timeout=300)


def one_usage_line(done: subprocess.CompletedProcess[bytes]) -> str:
    assert done.returncode == 2, done.stderr.decode(errors="replace")[-3000:]
    [line] = done.stderr.decode().splitlines()
    assert line.startswith("inplace-doctor: error: ") and b"Traceback" not in done.stderr
    return line


# --- 3. the script's exit status is passed on, as the shell would see it ------------------------------


@pytest.mark.slow
def test_a_script_whose_intended_program_exits_5_gets_no_proof(tmp_path: Path) -> None:
    # issue 38: "proven" needs the intended program to run to its end with exit 0; this one exits 5
    # (the script as it is stops at its in-place error first: fix exits 1, findings remain)
    program = TWO_STEP_TRAIN + "import sys\nsys.exit(5)\n"
    project = git_project(tmp_path, {"train.py": program})
    done = cli("fix", "train.py", cwd=project)
    out = done.stdout.decode()
    assert done.returncode == 1, (out, done.stderr.decode()[-3000:])
    assert "fixed" not in out and (project / "train.py").read_text() == program
    assert ("insert `feats = feats.clone()` at train.py:19: the intended program (every saved tensor copied at save) "
            "exit 5: nothing can be proven equal to it") in out, out


@pytest.mark.parametrize("command", ["run", pytest.param("fix", marks=pytest.mark.slow)])
def test_a_scripts_own_exit_status_without_findings_is_passed_on(tmp_path: Path, command: str) -> None:
    project = git_project(tmp_path, {"job.py": "import sys\nprint('done')\nsys.exit(5)\n"})
    done = cli(command, "job.py", cwd=project)
    assert done.returncode == 5, done.stderr.decode()[-3000:]
    assert done.stdout.startswith(b"done\n")


@pytest.mark.parametrize("command", ["run", pytest.param("fix", marks=pytest.mark.slow)])
def test_a_script_killed_by_sigterm_exits_143_as_the_shell_reports_it(tmp_path: Path, command: str) -> None:
    script = "import os, signal\nprint('started', flush=True)\nos.kill(os.getpid(), signal.SIGTERM)\n"
    project = git_project(tmp_path, {"job.py": script})
    assert python("job.py", project).returncode == -15  # python itself dies of the signal: the shell says 143
    done = cli(command, "job.py", cwd=project)
    assert done.stdout == b"started\n"
    if command == "run":  # the script runs in the tool's own process, which dies of it as python does
        assert done.returncode == -15, done.stderr.decode()[-3000:]
    else:  # the script died in a child: fix says so and exits 128 + 15, never 241 (-15 & 0xff)
        assert done.returncode == 143, done.stderr.decode()[-3000:]
        assert done.stderr.decode().splitlines()[-1] == (
            "inplace-doctor: the script's run under inplace-doctor was killed by SIGTERM (exit 143, as a shell "
            "reports it) before it gave a report")


@pytest.mark.slow
def test_fix_on_a_factory_that_raises_exits_3_with_its_traceback_as_audit_does(tmp_path: Path) -> None:
    project = git_project(tmp_path, {"models.py": "def build():\n    raise ValueError('no such layer: conv9')\n"})
    audited = cli("audit", "models:build", "--input", "2x3", cwd=project)
    fixed = cli("fix", "models:build", "--input", "2x3", cwd=project)
    assert audited.returncode == fixed.returncode == 3, fixed.stderr.decode()[-3000:]
    for done in (audited, fixed):
        err = done.stderr.decode()
        assert err.startswith("Traceback (most recent call last):\n")
        assert 'models.py", line 2, in build' in err and "ValueError: no such layer: conv9" in err
        assert err.splitlines()[-1] == "inplace-doctor: calling models:build raised ValueError: no such layer: conv9"


# --- 7. `-` is standard output -------------------------------------------------------------------------


def test_audit_output_dash_is_stdout_and_makes_no_file(tmp_path: Path) -> None:
    done = cli("audit", BROKEN, "--output", "-", "--format", "json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr.decode()[-3000:]
    assert json.loads(done.stdout)["tool"] == "inplace-doctor"
    assert not (tmp_path / "-").exists()


def test_audit_html_dash_is_the_page_alone_on_stdout_and_the_report_goes_to_stderr(tmp_path: Path) -> None:
    done = cli("audit", BROKEN, "--html", "-", cwd=tmp_path)
    assert done.returncode == 1, done.stderr.decode()[-3000:]
    assert done.stdout.startswith(b"<!DOCTYPE html>") and done.stdout.rstrip().endswith(b"</html>")
    assert done.stderr.startswith(b"inplace-doctor audit of " + BROKEN.encode())
    assert not (tmp_path / "-").exists()


@pytest.mark.slow
def test_optimize_write_dash_prints_the_config_alone_on_stdout(tmp_path: Path) -> None:
    done = cli("optimize", "inplace_doctor.examples:residual_relu", "--write", "-", "--no-checkpoint", "--steps", "1",
               cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    config = tomllib.loads(done.stdout.decode())
    assert config["inplace"] == {"act": False}
    assert done.stderr.startswith(b"inplace-doctor optimize: inplace_doctor.examples:residual_relu")  # the plan
    assert b"wrote" not in done.stderr
    assert not (tmp_path / "-").exists()


def test_run_output_dash_puts_the_report_after_the_scripts_own_output(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text("print('from the script')\n")
    done = cli("run", "--output", "-", "--format", "json", "job.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    first, _, report = done.stdout.partition(b"\n")
    assert first == b"from the script" and report.startswith(b"{")
    assert not (tmp_path / "-").exists()


def test_two_options_naming_dash_are_one_usage_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", BROKEN, "--output", "-", "--html", "-"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == ("inplace-doctor: error: --output - and --html - both name standard output, where "
                                 "the second would follow the first in one stream; give one of them a file\n")


def test_dot_slash_dash_still_names_a_file(tmp_path: Path) -> None:
    done = cli("audit", BROKEN, "--output", "./-", cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == b""
    assert (tmp_path / "-").read_text().startswith("inplace-doctor audit of")


# --- 8. a hard link keeps seeing the file fix edits ----------------------------------------------------


def test_write_all_keeps_a_hard_link_and_the_inode(tmp_path: Path) -> None:
    path, other, plain = tmp_path / "train.py", tmp_path / "also.py", tmp_path / "plain.py"
    path.write_bytes(b"x = 1\nx.mul_(2)\n")
    os.link(path, other)
    plain.write_bytes(b"y = 1\n")
    inode = path.stat().st_ino
    write_all({str(path): (b"x = 1\nx.mul_(2)\n", b"x = 1\nx = x.clone()\nx.mul_(2)\n"),
               str(plain): (b"y = 1\n", b"y = 2\n")})
    assert other.read_bytes() == path.read_bytes() == b"x = 1\nx = x.clone()\nx.mul_(2)\n"
    assert path.stat().st_ino == inode and path.stat().st_nlink == 2
    assert plain.read_bytes() == b"y = 2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["also.py", "plain.py", "train.py"]  # nothing staged left


@pytest.mark.slow
def test_fix_writes_the_edit_where_both_names_of_a_hard_linked_script_see_it(tmp_path: Path) -> None:
    (tmp_path / "project").mkdir()
    project = git_project(tmp_path / "project", {"train.py": TWO_STEP_TRAIN})
    other = tmp_path / "kept_elsewhere.py"
    os.link(project / "train.py", other)
    done = cli("fix", "train.py", cwd=project)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert "feats = feats.clone()" in other.read_text()
    assert other.read_bytes() == (project / "train.py").read_bytes()
    assert (project / "train.py").stat().st_nlink == 2


# --- 9. what used to crash the tool (exit 4) ----------------------------------------------------------

UNPRINTABLE = """\
class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no text")

raise Unprintable()
"""


@pytest.mark.parametrize("command", ["run", pytest.param("fix", marks=pytest.mark.slow)])
def test_an_exception_whose_str_raises_is_the_scripts_error_not_the_tools(tmp_path: Path, command: str) -> None:
    project = git_project(tmp_path, {"job.py": UNPRINTABLE})
    own = python("job.py", project)
    done = cli(command, "job.py", cwd=project)
    assert own.returncode == done.returncode == 1, done.stderr.decode()[-3000:]
    err = done.stderr.decode()
    assert "Unprintable: <exception str() failed>" in err and "inplace-doctor failed" not in err
    assert own.stderr.decode().splitlines()[-1] in err.splitlines()


@pytest.mark.parametrize("command", ["run", pytest.param("fix", marks=pytest.mark.slow)])
def test_a_script_printing_bytes_that_are_not_utf8_has_them_passed_on_unchanged(tmp_path: Path, command: str) -> None:
    script = "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe raw\\n')\nsys.stdout.buffer.flush()\n" \
             "sys.stderr.buffer.write(b'err \\xe9\\n')\n"
    project = git_project(tmp_path, {"job.py": script})
    done = cli(command, "job.py", cwd=project)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    assert done.stdout.startswith(b"\xff\xfe raw\n")
    assert b"inplace-doctor failed" not in done.stderr


@pytest.mark.slow
def test_fix_diff_to_a_full_disk_is_one_line_and_exit_2(tmp_path: Path) -> None:
    project = git_project(tmp_path, {"train.py": TWO_STEP_TRAIN})
    with open("/dev/full", "wb") as full:
        done = subprocess.run([sys.executable, "-m", "inplace_doctor", "fix", "--diff", "train.py"], cwd=project,
                              env={**os.environ, "PYTHONPATH": SRC}, stdout=full, stderr=subprocess.PIPE, timeout=300)
    err = done.stderr.decode()
    assert done.returncode == 2, err[-3000:]
    assert err.splitlines()[-1] == "inplace-doctor: error: cannot write to stdout: No space left on device"
    assert "Traceback" not in err


def test_a_pyproject_nested_too_deep_is_one_line_naming_it(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.other]\nx = " + "[" * 10000 + "]" * 10000 + "\n")
    monkeypatch.chdir(tmp_path)
    assert main(["audit", BROKEN]) == 2
    out, err = capsys.readouterr()
    [line] = err.splitlines()
    assert str(tmp_path / "pyproject.toml") in line and "nest deeper" in line and out == ""


# --- 10. inputs python refuses, or that cannot be read ----------------------------------------------


@pytest.mark.parametrize("source", [
    b"# caf\xe9: a Latin-1 comment, no coding line\nopen('ran', 'w').close()\n",
    b"s = 'caf\xe9'\nopen('ran', 'w').close()\n",
    b"open('ran', 'w').close()\r# caf\xe9\r\n",
    b"x = 1\n#\x00\nopen('ran', 'w').close()\n",
], ids=["comment", "literal", "cr-line", "null-byte"])
def test_run_refuses_a_file_python_refuses_with_pythons_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], source: bytes
) -> None:
    (tmp_path / "job.py").write_bytes(source)
    own = python("job.py", tmp_path)
    assert own.returncode == 1 and not (tmp_path / "ran").exists()
    monkeypatch.chdir(tmp_path)
    assert main(["run", "job.py"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and not (tmp_path / "ran").exists(), err
    said = own.stderr.decode(errors="replace").splitlines()
    assert err.splitlines()[: len(said)] == said
    assert err.splitlines()[len(said):] == ["inplace-doctor: 0 finding(s); no backward pass completed"]


def test_run_runs_a_latin1_file_that_declares_its_encoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "job.py").write_bytes(b"#!/usr/bin/env python\n# -*- coding: latin-1 -*-\nprint('caf\xe9')\n")
    monkeypatch.chdir(tmp_path)
    assert main(["run", "job.py"]) == 0
    assert capsys.readouterr().out == "caf\xe9\n"


@pytest.mark.parametrize("argv", [
    ["verify", "inplace_doctor.examples:residual_relu"],
    ["memory", "inplace_doctor.examples:residual_relu"],
    ["optimize", "inplace_doctor.examples:residual_relu"],
    ["audit", BROKEN],
    ["run", "job.py"],
    ["fix", "job.py"],
], ids=lambda argv: argv[0])
def test_an_invalid_tracer_variable_is_refused_by_every_command_that_traces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    (tmp_path / "job.py").write_text("open('ran', 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("INPLACE_DOCTOR_TRACER", "turbo")
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == ("inplace-doctor: error: INPLACE_DOCTOR_TRACER='turbo' is not a tracer; choose one "
                                 "of auto, fast, deep, or unset it\n")
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize(("command", "kind"), [
    ("audit", "fifo"), ("audit", "dev-zero"), ("audit", "dev-null"), ("audit", "dangling-link"),
    ("run", "fifo"), ("fix", "fifo"),
])
def test_a_pyproject_that_is_not_a_file_is_refused_unread_and_nothing_runs(tmp_path: Path, kind: str,
                                                                         command: str) -> None:
    project = git_project(tmp_path, {"job.py": "open('ran', 'w').close()\n"})
    pyproject = project / "pyproject.toml"
    if kind == "fifo":
        os.mkfifo(pyproject)
    else:
        pyproject.symlink_to({"dev-zero": "/dev/zero", "dev-null": "/dev/null", "dangling-link": "nowhere.toml"}[kind])
    line = one_usage_line(cli(command, BROKEN if command == "audit" else "job.py", cwd=project, timeout=120))
    assert f"project file {str(pyproject)!r}" in line and "nothing ran" in line
    assert not (project / "ran").exists()
