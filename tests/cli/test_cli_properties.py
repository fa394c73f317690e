"""Properties of the command line over its whole argument space (Hypothesis).

Each example is one generated command line of `audit`, `verify`, `memory` or `optimize` --
a good or bad model spec, `--input` shapes that mostly do not fit the model, huge or
negative seeds, good and misspelt option values, output paths that are new, that name a
file the user already has, a missing folder or a folder -- run in-process with `main(argv)`
in a fresh working directory holding a few files of the user's. For every one:

1. the exit code is 0, 1, 2 or 3: never 4 (the tool crashed) nor anything else;
2. exit 2 (usage) is exactly one stderr line, `inplace-doctor: error: ...`, and no
   traceback; exit 3 (the model raised) ends with one `inplace-doctor: ...` line (the
   model's traceback may come before it);
3. nothing is created, changed or removed in the working directory except the paths
   the command line names with `--output`, `--html`, `--png` or `--write`;
4. no existing file is replaced without `--force`: the user's files keep their bytes,
   and naming one of them as an output without `--force` is a usage error (exit 2).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import tempfile
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import HealthCheck, example, given, settings

from inplace_doctor.cli.main import main

BROKEN = "inplace_doctor.examples:sigmoid_then_relu"  # a real in-place bug: audit exits 1
SILENT = "inplace_doctor.examples:residual_relu"  # runs, but verify differs
BAD_SPECS = ["nope", "inplace_doctor.examples:nope", "inplace_doctr.examples:sigmoid_then_relu", ":x", "a:b:c"]

# The user's files in the working directory: none of them is a report of the tool's.
USER_FILES = {
    "notes.txt": b"my notes: do not lose these\n",
    "inplace.toml": b'# hand-edited: keep act in place, I checked it\n[inplace]\n"act" = true\n',
    "report.txt": b"Quarterly report, draft 3 (not written by any tool)\n",
    "sub/keep.txt": b"a file in a sub-folder\n",
}
WRITE_OPTIONS = ("--output", "--html", "--png", "--write")
FOLDER = "<the working directory>"  # replaced by its absolute path when the example runs

PROPERTY_SETTINGS = settings(
    deadline=None,
    database=None,  # write nothing into the project (.hypothesis/)
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --- strategies ----------------------------------------------------------------------------

specs = st.one_of(st.sampled_from([BROKEN, SILENT]), st.sampled_from([BROKEN, SILENT]), st.sampled_from(BAD_SPECS))

dims = st.sampled_from([0, 1, 2, 3, 4, 5, 6, 8])  # 8 fits the examples' Linear(8, 8); all stay tiny
dtype_suffixes = st.sampled_from(
    ["", "", "", ":float32", ":float64", ":float16", ":bfloat16", ":int64", ":bool", ":flaot32", ":"]
)
shapes = st.builds(lambda ds, suffix: "x".join(map(str, ds)) + suffix, st.lists(dims, min_size=1, max_size=4), dtype_suffixes)
inputs = st.one_of(shapes, shapes, st.text(max_size=8))

seeds = st.one_of(
    st.integers(-1000, 1000),
    st.sampled_from([-(2**70), 2**70, -(2**63), 2**64 - 1, 2**64, -(2**63) - 1]),
).map(str) | st.sampled_from(["", "x", "1.5"])

codes = st.one_of(
    st.lists(st.sampled_from([f"IPD10{i}" for i in range(1, 9)] + ["IPD1", "IPD", "ipd101"]), min_size=1, max_size=3).map(",".join),
    st.sampled_from(["IPD999", "", "foo", ",", " , ", "IPD101,,IPD102"]),
)

out_paths = st.sampled_from(
    ["out.txt", "out.json", "report.html", "sub/new.txt", *USER_FILES, "missing/x.txt", ".", "sub", FOLDER]
)
optimizers = st.sampled_from(["sgd", "sgd-momentum", "adam", "adamw", "none", "ADAM", "adma", "sgdm", ""])
small_counts = st.sampled_from(["1", "1", "0", "-1", "x"])
floats = st.sampled_from(["1e-6", "0", "1", "-1", "nan", "inf", "x"])


def _option(flag: str, values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return values.map(lambda v: [flag, v])


def _flag(flag: str) -> st.SearchStrategy[list[str]]:
    return st.just([flag])


@st.composite
def command_lines(draw: st.DrawFn, command: str, options: list[st.SearchStrategy[list[str]]], always: tuple[str, ...] | list[str] = ()) -> list[str]:
    """`command SPEC` and a few of `options` (each at most once) in any order, `always` appended."""
    chosen = draw(st.lists(st.sampled_from(range(len(options))), max_size=5, unique=True))
    groups = [draw(options[i]) for i in chosen]
    groups += [[flag, draw(inputs)] for flag in ["--input"] * draw(st.integers(0, 2))]
    groups = draw(st.permutations(groups))
    return [command, draw(specs), *[word for group in groups for word in group], *always]


common = [_option("--seed", seeds), _flag("--eval")]
audit_options = [
    *common,
    _option("--format", st.sampled_from(["text", "json", "sarif", "html", "TEXT", ""])),
    _option("--output", out_paths),
    _option("--html", out_paths),
    _option("--select", codes),
    _option("--ignore", codes),
    _option("--fail-on", st.sampled_from(["error", "warning", "info", "never", "WARNING", "warn", ""])),
    _flag("--no-backward"),
    _flag("--check-contents"),
    _option("--stack", st.sampled_from(["1", "2", "5", "0", "-3", "x"])),
    _flag("--force"),
]
verify_options = [
    *common,
    _option("--steps", small_counts),
    _option("--sgd", st.sampled_from(["0.1", "0", "-1", "nan", "x"])),
    _option("--atol", floats),
    _option("--rtol", floats),
]
training_options = [
    *common,
    _option("--optimizer", optimizers),
    _option("--format", st.sampled_from(["text", "json", "sarif", "JSON", ""])),
    _option("--html", out_paths),
    _option("--png", out_paths),
    _flag("--force"),
]


# --- running one command line ----------------------------------------------------------------


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under `root`, by path relative to it."""
    out: dict[str, bytes | None] = {}
    for folder, subfolders, files in os.walk(root):
        for name in subfolders:
            out[os.path.relpath(os.path.join(folder, name), root)] = None
        for name in files:
            path = os.path.join(folder, name)
            out[os.path.relpath(path, root)] = Path(path).read_bytes()
    return out


def _named_outputs(argv: list[str], root: Path) -> set[str]:
    """The paths (relative to `root`) that argv names after an option that writes a file."""
    named = set()
    for flag, value in itertools.pairwise(argv):
        if flag in WRITE_OPTIONS:
            named.add(os.path.relpath(os.path.join(root, value), root))
    return named


def check_command_line(argv: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="ipd-props-") as tmp:
        root = Path(os.path.realpath(tmp))
        for name, content in USER_FILES.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(content)
        argv = [str(root) if word == FOLDER else word for word in argv]
        before = _tree(root)
        out, err = io.StringIO(), io.StringIO()
        cwd = os.getcwd()
        os.chdir(root)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(argv)
        finally:
            os.chdir(cwd)
        after = _tree(root)

    stderr = err.getvalue()
    shown = f"argv: {argv}\nexit: {code}\nstderr:\n{stderr}"

    # 1. never a crash of the tool
    assert code in (0, 1, 2, 3), shown

    # 2. what stderr says for a usage error and for an error of the model
    lines = stderr.splitlines()
    if code in (2, 3):
        assert lines and lines[-1].startswith("inplace-doctor: "), shown
    if code == 2:
        assert len(lines) == 1, shown
        assert lines[0].startswith("inplace-doctor: error: "), shown
        assert "Traceback" not in stderr, shown

    # 3. nothing outside the named output paths is created, changed or removed
    named = _named_outputs(argv, root)
    removed = set(before) - set(after)
    assert not removed, f"removed {sorted(removed)}\n{shown}"
    touched = {path for path in after if path not in before or after[path] != before[path]}
    assert touched <= named, f"wrote {sorted(touched - named)}, which argv does not name\n{shown}"

    # 4. without --force, the user's files keep their bytes, and naming one is refused
    if "--force" not in argv:
        changed = {name for name in USER_FILES if after.get(name) != USER_FILES[name]}
        assert not changed, f"replaced {sorted(changed)} without --force\n{shown}"
        if named & set(USER_FILES) and argv[0] != "verify":
            assert code == 2, f"an existing file of the user's named as an output without --force\n{shown}"


# --- the properties --------------------------------------------------------------------------


@settings(PROPERTY_SETTINGS, max_examples=200)
@given(argv=command_lines("audit", audit_options))
@example(argv=["audit", BROKEN, "--output", "notes.txt"])  # not ours to replace: exit 2, notes.txt kept
@example(argv=["audit", BROKEN, "--output", "notes.txt", "--force"])  # replaced, as asked
@example(argv=["audit", BROKEN, "--html", "missing/x.txt", "--input", "2x8:"])
def test_audit_command_lines_keep_the_exit_code_stderr_and_file_contract(argv):
    check_command_line(argv)


@settings(PROPERTY_SETTINGS, max_examples=120)
@given(argv=command_lines("verify", verify_options))
@example(argv=["verify", SILENT, "--sgd", "-1"])  # a learning rate torch.optim.SGD refuses
def test_verify_command_lines_keep_the_exit_code_and_stderr_contract(argv):
    check_command_line(argv)


@settings(PROPERTY_SETTINGS, max_examples=200)
@given(
    argv=st.one_of(
        command_lines("memory", [*training_options, _option("--steps", small_counts)]),
        command_lines(
            "optimize",
            [*training_options, _option("--write", out_paths)],
            always=["--steps", "1", "--no-checkpoint"],
        ),
    )
)
@example(argv=["optimize", SILENT, "--write", "inplace.toml", "--steps", "1", "--no-checkpoint"])  # hand edits: exit 2
@example(argv=["optimize", SILENT, "--write", "inplace.toml", "--force", "--steps", "1", "--no-checkpoint"])
@example(argv=["memory", BROKEN, "--png", "report.txt", "--html", "out.html", "--force"])
def test_memory_and_optimize_command_lines_keep_the_exit_code_stderr_and_file_contract(argv):
    check_command_line(argv)
