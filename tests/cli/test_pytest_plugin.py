"""The pytest plugin (fixture, marker, option) run through pytester, and the notebook reprs."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch
from conftest import marker_line

import inplace_doctor as ipd
import pytest_inplace_doctor as plugin
from inplace_doctor.examples import LinearThenReLU, ResidualReLU, SigmoidThenReLU

pytest_plugins = ["pytester"]

PLUGIN = "pytest_inplace_doctor"
EXAMPLES_FILE = inspect.getsourcefile(SigmoidThenReLU)
assert EXAMPLES_FILE is not None


def _relu_line() -> int:
    """The line of SigmoidThenReLU.forward whose in-place ReLU overwrites the sigmoid's output."""
    lines, first = inspect.getsourcelines(SigmoidThenReLU.forward)
    (hit,) = [first + i for i, text in enumerate(lines) if "self.act(gate)" in text]
    return hit


def _installed_names() -> list[str]:
    """Names of the installed pytest11 entry points that load the plugin (none before it is packaged)."""
    return [ep.name for ep in entry_points(group="pytest11") if ep.value == PLUGIN]


def _plugin_args() -> list[str]:
    """`-p` for the plugin, unless an installed pytest11 entry point already loads it.

    With an entry point named other than the module, `-p pytest_inplace_doctor`
    would register the module a second time and pytest would stop with ValueError.
    """
    autoload = not os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    return [] if autoload and _installed_names() else ["-p", PLUGIN]


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """A fresh interpreter per run: in-process runs would re-import torch modules a previous run imported."""
    return pytester.runpytest_subprocess(*_plugin_args(), "-p", "no:cacheprovider", "--strict-markers", *args)


HEADER = """
    import pytest
    import torch
    from torch import nn
    from inplace_doctor.examples import LinearThenReLU, ResidualReLU, SigmoidThenReLU


    class EatsInput(nn.Module):
        \"\"\"Rectifies its caller's input in place: a warning (IPD106), not an error.\"\"\"

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return self.fc(x.relu_())


    def train_step(model, x):
        model(x).sum().backward()
"""


def _write(pytester: pytest.Pytester, body: str) -> Path:
    return pytester.makepyfile(textwrap.dedent(HEADER) + textwrap.dedent(body))


def test_fixture_returns_the_report_or_fails_with_it(pytester: pytest.Pytester) -> None:
    path = _write(pytester, """
        def test_clean(inplace_audit):
            report = inplace_audit(LinearThenReLU(), torch.randn(4, 8))
            assert report.findings == [] and report.backward

        def test_ignored(inplace_audit):
            assert inplace_audit(SigmoidThenReLU(), torch.randn(4, 8), ignore=["IPD101"]).findings == []

        def test_below_fail_on(inplace_audit):
            assert inplace_audit(EatsInput(), torch.randn(4, 8), fail_on="error").codes == ["IPD106"]

        def test_broken(inplace_audit):
            inplace_audit(SigmoidThenReLU(), torch.randn(4, 8))  # <call>

        def test_warning(inplace_audit):
            inplace_audit(EatsInput(), torch.randn(4, 8))
    """)
    result = _run(pytester)
    result.assert_outcomes(passed=3, failed=2)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(["*_ test_broken _*", "*in-place hazards found (fail_on=warning):*"])
    assert "error   IPD101  Tensor saved for backward is overwritten in place" in out
    assert "warning IPD106" in out
    # Where the model overwrote (the examples module), and which line of the test audited.
    assert f"examples/__init__.py:{_relu_line()}" in out.replace(os.sep, "/")
    call_line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.endswith("# <call>"))
    assert f"{path.name}:{call_line}: Failed" in out
    assert "def run(" not in out  # the fixture's own frame is hidden
    # The caller of the model is the test's line, in the report too: the plugin's frames are the tool's.
    assert f"called from {path.name}:{call_line} in test_broken: inplace_audit(" in out
    assert f"Backward ({path.name}:{call_line}) raised" in out
    assert "pytest_inplace_doctor" not in out


def test_marker_fails_a_test_that_trains_a_broken_model(pytester: pytest.Pytester) -> None:
    _write(pytester, """
        @pytest.mark.inplace_audit
        def test_raises():
            train_step(SigmoidThenReLU(), torch.randn(4, 8))

        @pytest.mark.inplace_audit
        def test_silently_wrong():
            train_step(ResidualReLU(), torch.randn(4, 8))

        @pytest.mark.inplace_audit(ignore=["IPD105"])
        def test_silently_wrong_ignored():
            train_step(ResidualReLU(), torch.randn(4, 8))
    """)
    result = _run(pytester)
    result.assert_outcomes(failed=2, passed=1)
    out = result.stdout.str()
    assert "the test raised InplaceError (fail_on=warning)" in out
    assert "inplace-doctor watch of test_marker_fails_a_test_that_trains_a_broken_model.py::test_raises" in out
    assert "error   IPD101" in out and f"examples/__init__.py:{_relu_line()}" in out.replace(os.sep, "/")
    assert "in-place hazards found while the test ran (fail_on=warning)" in out
    assert "error   IPD105" in out


def test_marker_counts_no_error_that_pytest_raises_expected(pytester: pytest.Pytester) -> None:
    """The InplaceError a test catches with pytest.raises is its subject; every other hazard still fails it."""
    path = _write(pytester, """
        def two_gates(x):
            \"\"\"Two in-place ReLUs over sigmoid outputs: backward stops at the second, before the first.\"\"\"
            first = torch.sigmoid(x)
            first.relu_()  # <first>
            second = torch.sigmoid(first * 2)
            second.relu_()
            return second


        @pytest.mark.inplace_audit
        def test_expected():
            with pytest.raises(RuntimeError):
                train_step(SigmoidThenReLU(), torch.randn(4, 8))

        @pytest.mark.inplace_audit
        def test_expected_with_match():
            with pytest.raises(RuntimeError, match="modified by an inplace operation") as caught:
                train_step(SigmoidThenReLU(), torch.randn(4, 8))
            assert type(caught.value) is RuntimeError  # PyTorch's own error, as the test sees it without the tool

        @pytest.mark.inplace_audit
        def test_expected_by_the_call_form():
            pytest.raises(RuntimeError, train_step, SigmoidThenReLU(), torch.randn(4, 8))

        @pytest.mark.inplace_audit
        def test_match_fails():
            with pytest.raises(RuntimeError, match="no such words"):
                train_step(SigmoidThenReLU(), torch.randn(4, 8))

        @pytest.mark.inplace_audit
        def test_expected_and_another_finding():
            with pytest.raises(RuntimeError):
                train_step(SigmoidThenReLU(), torch.randn(4, 8))
            train_step(ResidualReLU(), torch.randn(4, 8))

        @pytest.mark.inplace_audit
        def test_expected_and_another_tensor():
            with pytest.raises(RuntimeError):
                two_gates(torch.randn(4, 8, requires_grad=True)).sum().backward()

        @pytest.mark.inplace_audit
        def test_caught_without_pytest_raises():
            try:
                train_step(SigmoidThenReLU(), torch.randn(4, 8))
            except RuntimeError:
                pass

        @pytest.mark.inplace_audit
        def test_expected_at_the_write():
            w = torch.randn(3, requires_grad=True)
            with pytest.raises(RuntimeError, match="leaf Variable"):
                w.add_(1)

        @pytest.mark.inplace_audit
        def test_caught_at_the_write_without_pytest_raises():
            w = torch.randn(3, requires_grad=True)
            try:
                w.add_(1)
            except RuntimeError:
                pass

        def test_pytest_raises_itself_after_the_marked_tests():
            with pytest.raises(ValueError, match="x"):
                raise ValueError("x")
    """)
    result = _run(pytester, "-rP")
    result.assert_outcomes(passed=5, failed=5)
    out = result.stdout.str()
    for name in ("test_expected", "test_expected_with_match", "test_expected_by_the_call_form"):
        result.stdout.fnmatch_lines([f"*_ {name} _*", "*Captured inplace-doctor call*",
                                     "note: expected by pytest.raises, so not counted: the in-place error of IPD101 at *examples*__init__.py:*"])
    result.stdout.fnmatch_lines(["*_ test_match_fails _*", "*Regex pattern did not match*", "*Captured inplace-doctor call*", "error   IPD101*"])
    result.stdout.fnmatch_lines(["*_ test_expected_and_another_finding _*", "in-place hazards found while the test ran*", "error   IPD105*", "note: expected by pytest.raises*"])
    # Backward stopped at the second gate's tensor, expected; the first gate's is another hazard.
    result.stdout.fnmatch_lines(["*_ test_expected_and_another_tensor _*", "in-place hazards found while the test ran*"])
    another = out.split("_ test_expected_and_another_tensor _")[1].split("_ test_caught_without_pytest_raises _")[0]
    assert "warning IPD101" in another and "error   IPD101" not in another
    assert f"{path.name}:{marker_line(path, 'first')}" in another
    result.stdout.fnmatch_lines(["*_ test_caught_without_pytest_raises _*", "in-place hazards found while the test ran*", "error   IPD101*"])
    result.stdout.fnmatch_lines(["*_ test_expected_at_the_write _*", "*Captured inplace-doctor call*",
                                 "note: expected by pytest.raises, so not counted: the in-place error of IPD102 at *"])
    result.stdout.fnmatch_lines(["*_ test_caught_at_the_write_without_pytest_raises _*",
                                 "in-place hazards found while the test ran*", "error   IPD102*", "*caught: your program*"])
    assert "FAILED test_marker_counts_no_error_that_pytest_raises_expected.py::test_pytest_raises_itself" not in out


def test_marker_arguments_select_ignore_and_fail_on(pytester: pytest.Pytester) -> None:
    _write(pytester, """
        kept = []  # the graph stays alive after the test body: a prediction no backward confirmed (info)


        @pytest.mark.inplace_audit(fail_on="info")
        def test_forward_only():
            kept.append(SigmoidThenReLU()(torch.randn(4, 8)))

        @pytest.mark.inplace_audit(ignore=["IPD101"])
        def test_ignored():
            kept.append(SigmoidThenReLU()(torch.randn(4, 8)))

        @pytest.mark.inplace_audit(select="IPD106")
        def test_not_selected():
            kept.append(SigmoidThenReLU()(torch.randn(4, 8)))

        @pytest.mark.inplace_audit(fail_on="error")
        def test_warning_below_fail_on():
            train_step(EatsInput(), torch.randn(4, 8))

        @pytest.mark.inplace_audit
        def test_clean_training():
            model = LinearThenReLU()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(2):
                train_step(model, torch.randn(4, 8))
                opt.step()
                opt.zero_grad()

        @pytest.mark.inplace_audit(fail_on="loud")
        def test_bad_fail_on():
            pass

        @pytest.mark.inplace_audit(ignored=["IPD101"])
        def test_misspelt():
            pass

        @pytest.mark.inplace_audit(fail_on="error")
        def test_own_failure():
            EatsInput()(torch.randn(4, 8))
            assert False, "the test's own failure"
    """)
    result = _run(pytester, "-rP")
    result.assert_outcomes(passed=4, failed=4)
    result.stdout.fnmatch_lines(["*_ test_forward_only _*", "in-place hazards found while the test ran (fail_on=info):"])
    out = result.stdout.str()
    assert "@pytest.mark.inplace_audit: fail_on must be one of error, warning, info, got 'loud'" in out
    assert "@pytest.mark.inplace_audit: unknown argument(s) ignored; it takes select=, ignore=, fail_on=" in out
    assert "hidden" not in out and "pytest_plugin.py" not in out  # no plugin frames, no note about them
    # Findings below fail_on are not lost: a report section of the test, shown when it fails (and with -rP).
    result.stdout.fnmatch_lines(["*_ test_own_failure _*", "*the test's own failure*", "*Captured inplace-doctor call*", "warning IPD106*"])
    result.stdout.fnmatch_lines(["*= PASSES =*", "*_ test_warning_below_fail_on _*", "*Captured inplace-doctor call*", "warning IPD106*"])


def test_command_line_option_sets_the_default_fail_on(pytester: pytest.Pytester) -> None:
    _write(pytester, """
        def test_fixture(inplace_audit):
            inplace_audit(EatsInput(), torch.randn(4, 8))

        @pytest.mark.inplace_audit
        def test_marker():
            EatsInput()(torch.randn(4, 8))

        @pytest.mark.inplace_audit(fail_on="warning")
        def test_explicit_fail_on_wins():
            EatsInput()(torch.randn(4, 8))
    """)
    result = _run(pytester, "--inplace-doctor-fail-on=error")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*_ test_explicit_fail_on_wins _*"])


def test_marker_and_option_are_registered(pytester: pytest.Pytester) -> None:
    """`--strict-markers` accepts the marker; in-process: these runs import no torch module of their own."""
    result = pytester.runpytest_inprocess(*_plugin_args(), "-p", "no:cacheprovider", "--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.inplace_audit(select=None, ignore=None, fail_on=None): run the test*"])
    help_text = pytester.runpytest_inprocess(*_plugin_args(), "-p", "no:cacheprovider", "--help").stdout.str()
    assert "--inplace-doctor-fail-on={error,warning,info}" in help_text


def test_entry_point_and_dash_p_together(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the pytest11 entry point named after the module, `-p` and `pytest_plugins` stay harmless."""
    dist = pytester.path / "site" / "fake_ipd-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-ipd\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(f"[pytest11]\n{PLUGIN} = {PLUGIN}\n")
    pytester.makeconftest(f"pytest_plugins = [{PLUGIN!r}]")
    pytester.makepyfile("""
        import pytest

        @pytest.mark.inplace_audit
        def test_loaded(inplace_audit):
            pass
    """)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(pytester.path / "site"), os.environ.get("PYTHONPATH")])))
    # An installed entry point named otherwise would load the module a second time: block it here.
    blocked = [arg for name in _installed_names() if name != PLUGIN for arg in ("-p", f"no:{name}")]
    result = pytester.runpytest_subprocess(*blocked, "-p", PLUGIN, "-p", "no:cacheprovider", "--strict-markers")
    result.assert_outcomes(passed=1)


_PROBE = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("probe_plugin", {path!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "inplace_doctor")))
print(heavy)
"""


def test_the_plugin_module_imports_no_torch() -> None:
    """Its own top level needs only pytest (loaded from its file, without the package)."""
    assert plugin.__file__ is not None
    code = _PROBE.format(path=plugin.__file__)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_importing_the_plugin_by_name_imports_no_torch() -> None:
    code = f"import sys, {PLUGIN}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# --- notebook reprs ---


def test_report_repr_html_escapes_and_colours() -> None:
    report = ipd.audit(SigmoidThenReLU(), torch.randn(4, 8))
    html_text = report._repr_html_()
    assert html_text.startswith('<pre class="inplace-doctor-report"') and html_text.endswith("</pre>")
    assert "<script" not in html_text
    assert '<span style="color:#b00020;font-weight:bold">error   IPD101' in html_text
    assert "`relu_`" in html_text and "&quot;one of the variables" in html_text  # the why line, escaped
    report.notes.append("<b>&</b>")
    assert "note: &lt;b&gt;&amp;&lt;/b&gt;" in report._repr_html_()
    clean = ipd.audit(LinearThenReLU(), torch.randn(4, 8))._repr_html_()
    assert "No in-place hazards found." in clean and "#b00020" not in clean


def test_verify_result_repr_html() -> None:
    bad = ipd.verify(ResidualReLU(), torch.randn(4, 8))._repr_html_()
    assert bad.startswith('<pre class="inplace-doctor-verify"') and "color:#b00020" in bad
    assert "not equivalent" in bad and "module act (inplace=True)" in bad
    good = ipd.verify(LinearThenReLU(), torch.randn(4, 8))._repr_html_()
    assert "color:#2e7d32" in good and "equivalent: outputs" in good
    hostile = ipd.VerifyResult(equivalent=False, error="<script>alert(1)</script> & more")._repr_html_()
    assert "<script" not in hostile and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in hostile
