"""The `inplace-doctor` command line: exit codes, report formats, rule selection, hints on misuse.

Most tests call `inplace_doctor.cli.main(argv)` in-process (fast); the last two run the
real entry points (`python -m inplace_doctor` and the `inplace-doctor` console script) in
subprocesses started in the background at the first test, so that their torch imports overlap
the in-process tests.

Exit codes: 0 clean, 1 findings, 2 usage error (one stderr line), 3 the user's code raised.
"""

from __future__ import annotations

import inspect
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import inplace_doctor.examples
from inplace_doctor.cli.main import main

BROKEN = "inplace_doctor.examples:sigmoid_then_relu"
CLEAN = "inplace_doctor.examples:linear_then_relu"
MUTATION_CODE = "return self.act(gate)"
SAVED_CODE = "gate = torch.sigmoid(self.fc(x))"
ANSI = "\x1b["

# A user's factory module, written into a temporary directory: factories returning a bare model
# (so the inputs must come from --input), and ones that misbehave.
FACTORY_MODULE = "ipd_cli_test_factories"
FACTORY_SOURCE = '''
from torch import nn


def gated():
    return nn.Sequential(nn.Linear(8, 8), nn.Sigmoid(), nn.ReLU(inplace=True))


def embedding():
    return nn.Embedding(2, 8)


def not_a_module():
    return "not a model"


def failing_factory():
    raise RuntimeError("factory failed on purpose")
'''


def _example_line(code: str) -> int:
    """1-based line number of `code` in the bundled examples' source."""
    lines = Path(inspect.getfile(inplace_doctor.examples)).read_text(encoding="utf-8").splitlines()
    [index] = [i for i, line in enumerate(lines) if code in line]
    return index + 1


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code, out, err = run_cli(capsys, *argv, "--format", "json")
    assert err == "", err
    return code, json.loads(out)


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run a misuse; check exit 2, nothing on stdout, exactly one stderr line; return that line."""
    code, out, err = run_cli(capsys, *argv)
    assert code == 2, (code, out, err)
    assert out == ""
    assert err.endswith("\n")
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("inplace-doctor: error: ")
    assert "Traceback" not in err
    assert ANSI not in err
    return lines[0]


@pytest.fixture
def factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`ipd_cli_test_factories` importable from a fresh directory on sys.path."""
    (tmp_path / f"{FACTORY_MODULE}.py").write_text(FACTORY_SOURCE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, FACTORY_MODULE, raising=False)
    yield tmp_path
    sys.modules.pop(FACTORY_MODULE, None)


# --- findings and exit codes -------------------------------------------------------------


def test_broken_example_exits_1_and_names_both_lines(capsys):
    code, out, err = run_cli(capsys, "audit", BROKEN)
    assert code == 1
    assert err == ""
    assert "IPD101" in out
    assert MUTATION_CODE in out
    assert SAVED_CODE in out
    assert out.index(MUTATION_CODE) < out.index(SAVED_CODE)  # "overwritten" first, then "saved"
    assert "confirmed by backward" in out
    assert "1 finding: 1 error" in out


def test_clean_example_exits_0(capsys):
    code, out, err = run_cli(capsys, "audit", CLEAN)
    assert code == 0
    assert err == ""
    assert "No in-place hazards found." in out
    assert "IPD1" not in out


@pytest.mark.parametrize(
    ("factory", "expected"),
    [("residual_sin_add", "IPD101"), ("data_write_after_save", "IPD104")],
)
def test_other_broken_examples_report_their_rule(capsys, factory, expected):
    code, report = run_json(capsys, "audit", f"inplace_doctor.examples:{factory}")
    assert code == 1
    assert [f["code"] for f in report["findings"]] == [expected]


def test_eval_flag_audits_in_eval_mode(capsys):
    code, report = run_json(capsys, "audit", CLEAN, "--eval")
    assert code == 0
    assert report["mode"] == "eval"
    code, report = run_json(capsys, "audit", CLEAN)
    assert report["mode"] == "train"


# --- JSON and --output --------------------------------------------------------------------


def test_json_report_is_valid_and_locates_both_sites(capsys):
    code, report = run_json(capsys, "audit", BROKEN)
    assert code == 1
    assert report["schema_version"] == 3
    assert report["target"] == BROKEN
    assert report["backward"] is True
    [finding] = report["findings"]
    assert finding["code"] == "IPD101"
    assert finding["severity"] == "error"
    assert finding["confirmed"] is True
    assert finding["mutation"]["line"] == _example_line(MUTATION_CODE)
    assert finding["saved"]["line"] == _example_line(SAVED_CODE)
    assert finding["mutation"]["code"].startswith(MUTATION_CODE)
    assert finding["saved"]["code"].startswith(SAVED_CODE)
    assert report["summary"]["error"] == 1


def test_output_file_receives_json_and_stdout_stays_empty(capsys, tmp_path):
    target = tmp_path / "report.json"
    code, out, err = run_cli(capsys, "audit", BROKEN, "--format", "json", "--output", str(target))
    assert code == 1
    assert out == ""
    assert err == ""
    report = json.loads(target.read_text(encoding="utf-8"))
    assert report["schema_version"] == 3
    assert [f["code"] for f in report["findings"]] == ["IPD101"]


def test_output_file_receives_plain_text(capsys, tmp_path):
    target = tmp_path / "report.txt"
    code, out, err = run_cli(capsys, "audit", BROKEN, "--output", str(target))
    assert (code, out, err) == (1, "", "")
    text = target.read_text(encoding="utf-8")
    assert MUTATION_CODE in text and SAVED_CODE in text and "IPD101" in text
    assert ANSI not in text


# --- rule selection -----------------------------------------------------------------------


def test_ignore_the_only_rule_that_fires_exits_0(capsys):
    code, out, err = run_cli(capsys, "audit", BROKEN, "--ignore", "IPD101")
    assert code == 0, err
    assert "error   IPD101" not in out and "No in-place hazards found." in out
    # The report still says backward stopped at an in-place error it was told to ignore.
    assert "rule not selected (IPD101)" in out
    assert "Traceback" not in err


def test_select_a_rule_that_does_not_fire_exits_0(capsys):
    code, out, err = run_cli(capsys, "audit", BROKEN, "--select", "IPD104")
    assert code == 0, err
    assert "error   IPD101" not in out and "No in-place hazards found." in out
    # The report still says backward stopped at an in-place error it was told to ignore.
    assert "rule not selected (IPD101)" in out
    assert "Traceback" not in err


def test_ignore_applies_to_findings_at_the_write(capsys):
    # Forward only, so the ignored hazard is never hit by backward: the report is clean.
    code, out, err = run_cli(capsys, "audit", BROKEN, "--ignore", "IPD101", "--no-backward")
    assert (code, err) == (0, "")
    assert "No in-place hazards found." in out
    # A silent hazard (no backward error) is simply dropped when ignored.
    code, out, err = run_cli(capsys, "audit", "inplace_doctor.examples:data_write_after_save", "--ignore", "ipd104")
    assert (code, err) == (0, "")
    assert "No in-place hazards found." in out


@pytest.mark.parametrize("select", ["IPD1", "IPD101", "ipd101", "IPD104,IPD1"])
def test_select_by_code_or_prefix_still_reports(capsys, select):
    code, out, err = run_cli(capsys, "audit", BROKEN, "--select", select)
    assert (code, err) == (1, "")
    assert "IPD101" in out


def test_no_backward_reports_at_the_write_unconfirmed(capsys):
    code, out, err = run_cli(capsys, "audit", BROKEN, "--no-backward")
    assert (code, err) == (1, "")
    assert "IPD101" in out and MUTATION_CODE in out and SAVED_CODE in out
    assert "forward only" in out
    code, report = run_json(capsys, "audit", BROKEN, "--no-backward")
    assert code == 1
    assert report["backward"] is False
    [finding] = report["findings"]
    assert finding["code"] == "IPD101"
    # A prediction no backward ran to confirm: a warning (exit 1 at the default fail-on), saying why.
    assert finding["confirmed"] is False and finding["severity"] == "warning"
    assert finding["unreached"] == "no-backward"


# --- --input ------------------------------------------------------------------------------


def test_input_feeds_a_factory_that_returns_only_a_model(capsys, factories):
    code, report = run_json(capsys, "audit", f"{FACTORY_MODULE}:gated", "--input", "4x8")
    assert code == 1
    [finding] = report["findings"]
    assert finding["code"] == "IPD101"
    assert finding["mutation"]["op"] == "aten.relu_"
    assert finding["saved"]["op"] == "aten.sigmoid"


def test_integer_input_for_an_embedding(capsys, factories):
    code, out, err = run_cli(capsys, "audit", f"{FACTORY_MODULE}:embedding", "--input", "2x16:int64")
    assert (code, err) == (0, "")
    assert "No in-place hazards found." in out


def test_input_overrides_the_factory_example_inputs(capsys):
    code, report = run_json(capsys, "audit", BROKEN, "--input", "3x8")
    assert code == 1
    [finding] = report["findings"]
    assert "[3, 8] float32" in finding["message"]  # the factory's own example is [4, 8]


# --- usage errors: exit 2, one line, with a hint ------------------------------------------


@pytest.mark.parametrize(
    ("argv", "hints"),
    [
        pytest.param(
            ["audit", "inplace_doctor.examples"],
            ["PKG.MODULE:FACTORY", "inplace_doctor.examples:sigmoid_then_relu"],
            id="missing-colon",
        ),
        pytest.param(
            ["audit", "inplace_doctr.examples:x"],
            ["inplace_doctr.examples", "did you mean 'inplace_doctor.examples'"],
            id="module-not-importable",
        ),
        pytest.param(
            ["audit", "inplace_doctor.examples:sigmoid_the_relu"],
            ["sigmoid_the_relu", "did you mean 'sigmoid_then_relu'"],
            id="attribute-typo",
        ),
        pytest.param(
            ["audit", "inplace_doctor.examples:__doc__"], ["not callable"], id="not-callable"
        ),
        pytest.param(
            ["audit", BROKEN, "--input", "2x3xx4"], ["'2x3xx4'", "2x3x224x224"], id="bad-shape"
        ),
        pytest.param(
            ["audit", BROKEN, "--input", "2x3:floot"], ["'floot'", "did you mean 'float'"], id="bad-dtype"
        ),
        pytest.param(
            ["audit", BROKEN, "--format", "yaml"], ["'yaml'", "text", "json"], id="unknown-format"
        ),
        pytest.param(
            ["audit", BROKEN, "--select", "IPD901"], ["IPD901", "did you mean IPD101"], id="unknown-select"
        ),
        pytest.param(
            ["audit", BROKEN, "--ignore", "XYZ"], ["'XYZ'", "IPD101"], id="unknown-ignore"
        ),
        pytest.param(["audit", BROKEN, "--seed", "abc"], ["--seed", "'abc'"], id="bad-seed"),
        pytest.param(["frobnicate"], ["'frobnicate'", "audit"], id="unknown-subcommand"),
        pytest.param([], ["command"], id="no-subcommand"),
        pytest.param(["audit"], ["PKG.MODULE:FACTORY"], id="no-spec"),
        pytest.param(
            ["audit", f"{FACTORY_MODULE}:not_a_module", "--input", "4x8"],
            ["returned str", "nn.Module"],
            id="factory-returns-non-module",
        ),
        pytest.param(
            ["audit", f"{FACTORY_MODULE}:gated"], ["no inputs", "--input"], id="no-inputs-local"
        ),
        pytest.param(["rule", "IPD999"], ["IPD999", "did you mean IPD109"], id="unknown-rule-doc"),  # the closest code
    ],
)
def test_misuse_is_one_line_with_a_hint(capsys, factories, argv, hints):
    line = usage_error(capsys, *argv)
    for hint in hints:
        assert hint in line


def test_model_without_inputs_from_a_real_package(capsys):
    pytest.importorskip("torchvision")
    line = usage_error(capsys, "audit", "torchvision.models:resnet18")
    assert "no inputs" in line
    assert "--input" in line


def test_unwritable_output_is_a_usage_error(capsys, tmp_path):
    target = tmp_path / "no-such-dir" / "report.json"
    line = usage_error(capsys, "audit", BROKEN, "--output", str(target))
    assert "cannot write" in line
    assert str(target) in line
    assert not target.exists()


# --- the user's code raised: exit 3 -------------------------------------------------------


def test_model_raising_in_forward_exits_3_and_says_how_far(capsys, factories):
    code, out, err = run_cli(capsys, "audit", f"{FACTORY_MODULE}:gated", "--input", "4x5")
    assert code == 3
    assert out == ""
    last = err.splitlines()[-1]
    assert last.startswith("inplace-doctor: ")
    assert "during forward" in last
    assert "Sequential" in last
    assert "cannot be multiplied" in last  # PyTorch's own message is kept


def test_input_shape_mismatch_on_a_bundled_factory_exits_3(capsys):
    # --input replaces the factory's (4, 8) example; Linear(8, 8) cannot take width 5.
    code, out, err = run_cli(capsys, "audit", BROKEN, "--input", "4x5")
    assert code == 3
    assert "during forward" in err.splitlines()[-1]


def test_factory_raising_exits_3(capsys, factories):
    code, out, err = run_cli(capsys, "audit", f"{FACTORY_MODULE}:failing_factory", "--input", "4x8")
    assert code == 3
    assert out == ""
    last = err.splitlines()[-1]
    assert last.startswith("inplace-doctor: ")
    assert "failing_factory" in last
    assert "factory failed on purpose" in last


# --- rules and rule -----------------------------------------------------------------------


def test_rules_lists_every_rule(capsys):
    code, out, err = run_cli(capsys, "rules")
    assert (code, err) == (0, "")
    codes = [line.split()[0] for line in out.splitlines() if line.strip()]
    import inplace_doctor as ipd

    assert codes == sorted(ipd.RULES)  # every registered rule, in code order
    assert {"IPD101", "IPD102", "IPD103", "IPD104", "IPD106"} <= set(codes)


def test_rule_prints_documentation_case_insensitively(capsys):
    code, out, err = run_cli(capsys, "rule", "ipd104")
    assert (code, err) == (0, "")
    assert out.startswith("IPD104 ")
    assert ".data" in out


# --- colour -------------------------------------------------------------------------------


class _FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _audit_to_terminal(monkeypatch: pytest.MonkeyPatch) -> str:
    stream = _FakeTerminal()
    monkeypatch.setattr(sys, "stdout", stream)
    assert main(["audit", BROKEN]) == 1
    return stream.getvalue()


def test_every_exception_of_the_command_line_is_an_inplace_doctor_error():
    import importlib
    import pkgutil

    import inplace_doctor.cli
    from inplace_doctor.errors import InplaceDoctorError

    found = []
    for info in pkgutil.iter_modules(inplace_doctor.cli.__path__):
        module = importlib.import_module(f"inplace_doctor.cli.{info.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                found.append(obj)
                assert issubclass(obj, InplaceDoctorError), obj
    assert found  # CliUsageError, FactoryError


def test_no_ansi_codes_when_not_a_terminal(capsys, monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TERM", "xterm-256color")
    code, out, err = run_cli(capsys, "audit", BROKEN)
    assert code == 1
    assert "IPD101" in out
    assert ANSI not in out and ANSI not in err


def test_no_color_is_honoured_on_a_terminal(monkeypatch):
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("NO_COLOR", "1")
    plain = _audit_to_terminal(monkeypatch)
    assert "IPD101" in plain
    assert ANSI not in plain
    # Sanity check that the fake terminal would otherwise get colour.
    monkeypatch.delenv("NO_COLOR")
    assert ANSI in _audit_to_terminal(monkeypatch)


# --- real entry points in subprocesses ----------------------------------------------------
# Each subprocess pays for a torch import, so there are two, started in the background when
# the module's first test starts: a full audit through the console script and a usage error
# through `python -m inplace_doctor`.


def _console_script() -> str:
    found = shutil.which("inplace-doctor", path=str(Path(sys.executable).parent))
    assert found, f"no inplace-doctor console script next to {sys.executable}"
    return found


@pytest.fixture(scope="module", autouse=True)
def _entry_point_processes(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Start the entry-point subprocesses when this module's first test starts, so that their
    torch imports overlap the in-process tests; the tests at the end of the file collect them."""
    cwd = tmp_path_factory.mktemp("cli-cwd")
    (cwd / f"{FACTORY_MODULE}.py").write_text(FACTORY_SOURCE, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "PYTHONPATH")}
    env["NO_COLOR"] = "1"
    commands = {
        # The console script's sys.path[0] is its bin directory: the factory module is found only
        # because the CLI looks in the working directory.
        "script": [_console_script(), "audit", f"{FACTORY_MODULE}:gated", "--input", "4x8"],
        "module": [sys.executable, "-m", "inplace_doctor", "audit", "inplace_doctor.examples:sigmoid_the_relu"],
    }
    procs = {
        name: subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, cmd in commands.items()
    }
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.fixture(scope="module")
def entry_point_runs(_entry_point_processes: dict[str, subprocess.Popen[str]]) -> dict[str, tuple[int, str, str]]:
    results = {}
    for name, proc in _entry_point_processes.items():
        out, err = proc.communicate(timeout=180)
        results[name] = (proc.returncode, out, err)
    return results


def test_console_script_audits_a_factory_from_the_working_directory(entry_point_runs):
    code, out, err = entry_point_runs["script"]
    assert code == 1, err
    assert err == ""
    assert f"audit of {FACTORY_MODULE}:gated" in out
    assert "IPD101" in out
    assert "relu_" in out and "sigmoid" in out
    assert "1 finding: 1 error" in out
    assert ANSI not in out


def test_python_dash_m_usage_error_is_one_line(entry_point_runs):
    code, out, err = entry_point_runs["module"]
    assert code == 2
    assert out == ""
    assert err.splitlines() == [
        "inplace-doctor: error: 'inplace_doctor.examples' has no attribute 'sigmoid_the_relu'; "
        "did you mean 'sigmoid_then_relu'?"
    ]


def test_console_script_wrapper_is_not_reported_as_user_code(entry_point_runs):
    code, out, err = entry_point_runs["script"]
    assert code == 1, err
    assert "sys.exit(run())" not in out
    assert f"{os.sep}inplace-doctor:" not in out
