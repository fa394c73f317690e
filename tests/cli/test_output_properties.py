"""No byte of any file but the tool's own report changes (Hypothesis, issue 24).

Each example is one command line of `audit`, `run`, `optimize --write` or `fix`, run in a fresh
folder that holds existing files of every kind: the user's files (one naming the tool, a
hand-edited config, a read-only one, an empty one), an earlier report, symbolic links (to a
file, to a report, to nothing, to a folder), a folder, a FIFO nothing reads, and `/dev/null`,
named by relative, absolute and roundabout paths, with and without `--force`; `run`'s script
may change directory first. For every one:

1. the exit code is 0, 1 or 2, and exit 2 is one stderr line;
2. every entry of the folder keeps its kind, bytes, permissions and link target, except the
   files the options name (a link followed, relative to where the command started), and each
   of those that changed now holds what the option writes (a report of the tool's, or the
   config) and, without `--force`, was missing, empty or an earlier report before;
3. nothing else appears (no temporary file left behind).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, example, given, settings

from inplace_doctor.cli.main import main
from inplace_doctor.cli.provenance import is_report

BROKEN = "inplace_doctor.examples:sigmoid_then_relu"
EARLIER_REPORT = b"inplace-doctor audit of model (train, forward + backward)\n\nNo in-place hazards found.\n"
FILES = {
    "notes.txt": b"my notes: do not lose these\n",
    "pyproject.toml": b'[project]\nname = "mine"\ndependencies = ["inplace-doctor"]\n',
    "inplace.toml": b'# inplace-doctor in-place config, hand-edited\n[inplace]\n"act" = true\n',
    "readonly.txt": b"read-only notes\n",
    "empty.txt": b"",
    "report.txt": EARLIER_REPORT,
    "sub/keep.txt": b"in a sub-folder\n",
    "script.py": b"print('training')\n",
    "moving.py": b"import os\nos.chdir('sub')\nprint('training')\n",  # run's script that changes directory
}
LINKS = {"to_notes": "notes.txt", "to_report": "report.txt", "dangling": "missing.txt", "to_sub": "sub"}
ROOT = "<root>"  # the folder's absolute path, filled in when the example runs
PATHS = [
    *FILES, *LINKS, "new.txt", "sub/new.txt", "to_sub/new.txt", "to_sub/keep.txt", "./notes.txt",
    "sub/../notes.txt", "missing/x.txt", "sub", ".", "fifo", "/dev/null", f"{ROOT}/new.txt", f"{ROOT}/notes.txt",
]
REPORT_OPTIONS = ("--output", "--html")

SETTINGS = settings(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def _make_folder(root: Path) -> None:
    for name, content in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    (root / "readonly.txt").chmod(0o444)
    for name, target in LINKS.items():
        (root / name).symlink_to(target)
    os.mkfifo(root / "fifo")


def _tree(root: Path) -> dict[str, tuple[object, ...]]:
    """Every entry under `root` by relative path: its kind and what it holds, links not followed,
    FIFOs not opened."""
    out: dict[str, tuple[object, ...]] = {}
    for folder, subfolders, files in os.walk(root):
        for name in subfolders + files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            key = os.path.relpath(path, root)
            if stat.S_ISLNK(info.st_mode):
                out[key] = ("link", os.readlink(path))
            elif stat.S_ISREG(info.st_mode):
                out[key] = ("file", Path(path).read_bytes(), stat.S_IMODE(info.st_mode))
            else:
                out[key] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode))
    return out


def _named(argv: list[str], root: Path) -> dict[str, str]:
    """Relative path (a link followed) -> the option naming it, for every option that writes."""
    named = {}
    for flag, value in itertools.pairwise(argv):
        if flag in (*REPORT_OPTIONS, "--write"):
            named[os.path.relpath(os.path.realpath(os.path.join(root, value)), root)] = flag
    return named


def check(argv: list[str], *, in_process: bool = True) -> None:
    with tempfile.TemporaryDirectory(prefix="ipd-outputs-") as tmp:
        root = Path(os.path.realpath(tmp))
        _make_folder(root)
        argv = [word.replace(ROOT, str(root)) for word in argv]
        before, named = _tree(root), _named(argv, root)
        code, stderr = _run(argv, root, in_process)
        after = _tree(root)
        (root / "readonly.txt").chmod(0o644)
    shown = f"argv: {argv}\nexit: {code}\nstderr:\n{stderr}"

    assert code in (0, 1, 2), shown
    if code == 2:
        assert len(stderr.splitlines()) == 1 and stderr.startswith("inplace-doctor: error: "), shown

    changed = {path for path in set(before) | set(after) if before.get(path) != after.get(path)}
    for path in changed:
        assert path in named, f"{path} changed, which no option names\n{shown}"
        assert path in after, f"{path} was removed\n{shown}"
        kind, content = after[path][:2]
        assert kind == "file", shown
        if named[path] == "--write":
            assert isinstance(content, bytes) and content.startswith(b"# inplace-doctor"), shown
        else:
            assert isinstance(content, bytes) and is_report(content), f"{path} is not a report now\n{shown}"
        if "--force" not in argv:
            old = before.get(path)
            assert old is None or old[1] in (b"", EARLIER_REPORT) and named[path] != "--write", \
                f"{path} replaced without --force\n{shown}"


def _run(argv: list[str], root: Path, in_process: bool) -> tuple[int, str]:
    if not in_process:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
        done = subprocess.run([sys.executable, "-m", "inplace_doctor", *argv], cwd=root, env=env,
                              capture_output=True, text=True, timeout=600)
        return done.returncode, done.stderr
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(root)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    finally:
        os.chdir(cwd)
    return code, err.getvalue()


paths = st.sampled_from(PATHS)
force = st.lists(st.just("--force"), max_size=1)


@st.composite
def audit_lines(draw: st.DrawFn) -> list[str]:
    argv = ["audit", BROKEN, "--no-backward"]
    for option in draw(st.lists(st.sampled_from(REPORT_OPTIONS), min_size=1, max_size=2, unique=True)):
        argv += [option, draw(paths)]
    return argv + draw(st.sampled_from([[], ["--format", "json"], ["--format", "sarif"]])) + draw(force)


@st.composite
def run_lines(draw: st.DrawFn) -> list[str]:
    script = draw(st.sampled_from(["script.py", "moving.py"]))  # moving.py changes directory first
    return ["run", "--format", draw(st.sampled_from(["text", "json"])), "--output", draw(paths), *draw(force), script]


@settings(SETTINGS, max_examples=60)
@given(argv=audit_lines())
@example(argv=["audit", BROKEN, "--output", "pyproject.toml"])
@example(argv=["audit", BROKEN, "--output", "to_notes"])
@example(argv=["audit", BROKEN, "--output", "fifo"])
@example(argv=["audit", BROKEN, "--output", "notes.txt", "--html", "sub/../notes.txt", "--force"])
@example(argv=["audit", BROKEN, "--output", "report.txt", "--html", "to_report", "--force"])
def test_audit_changes_no_byte_but_its_own_reports(argv):
    check(argv)


@settings(SETTINGS, max_examples=40)
@given(argv=run_lines())
@example(argv=["run", "--output", "sub/keep.txt", "moving.py"])
@example(argv=["run", "--output", "keep.txt", "moving.py"])
def test_run_changes_no_byte_but_its_own_report(argv):
    check(argv)


@pytest.mark.slow
@settings(SETTINGS, max_examples=6)
@given(target=paths, forced=force)
@example(target="inplace.toml", forced=[])
@example(target="to_notes", forced=["--force"])
def test_optimize_write_changes_no_byte_but_its_config(target, forced):
    check(["optimize", BROKEN, "--steps", "1", "--no-checkpoint", "--write", target, *forced])


@pytest.mark.slow
@settings(SETTINGS, max_examples=2)
@given(flags=st.lists(st.sampled_from(["--diff", "--force"]), unique=True))
@example(flags=[])
def test_fix_on_a_script_with_nothing_to_fix_changes_no_byte(flags):
    check(["fix", *flags, "script.py"], in_process=False)
