"""Values and configs of the wrong shape: each is one usage line naming the key and the type it
needs (exit 2), never a traceback or a silently wrong setting; and the JSON the tool prints is
RFC 8259 JSON whatever the floats it holds."""

from __future__ import annotations

import io
import json
import math
import sys
from pathlib import Path

import jsonschema
import pytest
import torch

import inplace_doctor as ipd
from inplace_doctor.cli.main import main
from inplace_doctor.examples import ResidualReLU

SPEC = "inplace_doctor.examples:residual_relu"
SCHEMA = Path(ipd.__file__).parent / "schema" / "report.schema.json"


def one_usage_line(capsys, *argv: str) -> str:
    code = main(list(argv))
    _out, err = capsys.readouterr()
    assert code == 2, (code, err)
    [line] = err.splitlines()
    assert line.startswith("inplace-doctor: error: ")
    return line


# --- item 11: the mapping form refuses what the file form refuses ------------------------------


@pytest.mark.parametrize("value", ["false", "no", 0, 1, None, 0.0])
def test_apply_config_refuses_a_mapping_value_that_is_not_a_bool(value) -> None:
    model = ResidualReLU()
    with pytest.raises(ipd.UsageError, match=r"'act' is .*; each entry must be true or false \(True or False in Python\)"):
        ipd.apply_config(model, {"act": value})
    assert model.act.inplace is True  # nothing changed: not even to a truthy "false"


def test_apply_config_refuses_a_mapping_key_that_is_not_a_path() -> None:
    with pytest.raises(ipd.UsageError, match=r"key 1 is an integer \(1\); keys are module paths"):
        ipd.apply_config(ResidualReLU(), {1: False})


def test_the_file_form_and_the_mapping_form_refuse_alike(tmp_path) -> None:
    path = tmp_path / "inplace.toml"
    path.write_text('[inplace]\nact = "false"\n')
    with pytest.raises(ipd.UsageError, match=r"'act' is a string \('false'\); each entry must be true or false"):
        ipd.apply_config(ResidualReLU(), path)


# --- item 17: the shape of the whole config -----------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("[tool]\ninplace-doctor = 5\n", ("tool.inplace-doctor must be a table, [tool.inplace-doctor] with keys such as "
                                         "ignore = [\"IPD104\"], not an integer (5)")),
        ('tool = "x"\n', "tool must be a table ([tool.inplace-doctor] and other tools' settings), not a string ('x')"),
        ('[tool]\ninplace-doctor = "select"\n', "tool.inplace-doctor must be a table"),
        ("[tool.inplace-doctor]\nfail-on = 5\n", ("fail-on must be one of the strings error, warning, info, never, "
                                                 "not an integer (5)")),
        ("[tool.inplace-doctor]\nignore = 5\n", "ignore must be a list of rule codes, e.g. [\"IPD105\"], not an integer (5)"),
        ("[tool.inplace-doctor]\nper-module-ignores = 5\n", "per-module-ignores must be a table"),
        ('[tool.inplace-doctor]\nper-module-ignores = { "a.*" = 5 }\n', "per-module-ignores['a.*'] must be a list"),
    ],
)
def test_a_pyproject_value_of_the_wrong_type_is_one_usage_line(capsys, tmp_path, monkeypatch, body, expected) -> None:
    (tmp_path / "pyproject.toml").write_text(body)
    monkeypatch.chdir(tmp_path)
    line = one_usage_line(capsys, "audit", SPEC)
    assert expected in line and "pyproject.toml" in line


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("inplace-doctor = 5\n", ("inplace-doctor must be a table, [inplace-doctor] as optimize --write writes it, "
                                 "not an integer (5)")),
        ("inplace = 5\n", "inplace must be a table, [inplace] with \"module.path\" = true/false, not an integer (5)"),
        ("[inplace-doctor]\nnever-executed = 5\n", ("[inplace-doctor] never-executed must be an array of module paths "
                                                   "(strings), not an integer (5)")),
        ("[inplace-doctor]\nnever-executed = [1]\n", "never-executed must be an array of module paths"),
        ("[inplace-doctor]\ninputs = \"2x8\"\n", "[inplace-doctor] inputs must be an array of strings"),
        ("[inplace-doctor]\npeak-planned-bytes = true\n", "peak-planned-bytes must be an integer, not a boolean (True)"),
        ('[inplace]\nact = "false"\n', "'act' is a string ('false'); each entry must be true or false"),
        ("[inplace]\nlayer1.relu = false\n", ("'layer1' is a table: TOML reads an unquoted dotted key as nested "
                                              "tables; quote the module path: \"layer1.relu\" = false")),
    ],
)
def test_an_inplace_toml_value_of_the_wrong_type_is_one_usage_line(capsys, tmp_path, body, expected) -> None:
    config = tmp_path / "inplace.toml"
    config.write_text(body)
    line = one_usage_line(capsys, "verify", SPEC, "--config", str(config))
    assert expected in line and "inplace.toml" in line


# --- item 14: a tolerance must be finite ---------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--atol", "inf", "--rtol", "inf"], ("argument --atol: inf is not finite, and with it verify calls any two "
                                             "results equal; give a finite tolerance of at least 0, e.g. --atol 1e-6")),
        (["--rtol", "inf"], "argument --rtol: inf is not finite"),
        (["--atol", "nan"], "argument --atol: nan is not a number"),
        (["--rtol=-inf"], "argument --rtol: -inf is negative"),
        (["--atol=-1e-3"], "argument --atol: -1e-3 is negative"),
        (["--atol", "tight"], "argument --atol: invalid tolerance: 'tight'"),
    ],
)
def test_a_tolerance_that_is_not_finite_or_is_negative_is_one_usage_line(capsys, argv, expected) -> None:
    assert expected in one_usage_line(capsys, "verify", SPEC, *argv)


def test_a_zero_tolerance_is_an_exact_comparison_and_accepted(capsys) -> None:
    assert main(["verify", SPEC, "--atol", "0", "--rtol", "0"]) == 1  # residual_relu differs
    assert "act" in capsys.readouterr().out


# --- item 13: RFC 8259 JSON -----------------------------------------------------------------------


FACTORY = '''
import torch
from inplace_doctor.examples import ResidualReLU


def with_infinity():
    x = torch.randn(4, 8)
    x[0, 0] = float("-inf")
    x[1, 1] = float("nan")
    return ResidualReLU(), (x,)
'''


def strict_json(text: str):
    """`json.loads` as RFC 8259 (and `JSON.parse`) reads: NaN and Infinity are not JSON."""
    def refuse(constant: str):
        raise AssertionError(f"{constant} in the JSON output: not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def infinite_factory(tmp_path, monkeypatch) -> str:
    (tmp_path / "ipd_infinite_factory.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "ipd_infinite_factory", raising=False)
    return "ipd_infinite_factory:with_infinity"


def test_a_report_measuring_a_non_finite_difference_is_json(capsys, infinite_factory) -> None:
    assert main(["audit", infinite_factory, "--format", "json"]) == 1
    report = strict_json(capsys.readouterr().out)
    [finding] = [f for f in report["findings"] if f["code"] == "IPD105"]
    assert finding["details"]["max_difference"] in ("NaN", "Infinity")
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).validate(report)


def test_a_sarif_log_with_non_finite_details_is_json(capsys, infinite_factory) -> None:
    assert main(["audit", infinite_factory, "--format", "sarif"]) == 1
    assert strict_json(capsys.readouterr().out)["version"] == "2.1.0"


def test_every_non_finite_float_is_named_and_everything_else_kept() -> None:
    from inplace_doctor.render.json import dump

    stream = io.StringIO()
    dump({"a": [float("nan"), float("inf"), (float("-inf"), 1.5)], "b": {"c": 0.0, "d": 3, "e": None}}, stream)
    assert strict_json(stream.getvalue()) == {
        "a": ["NaN", "Infinity", ["-Infinity", 1.5]], "b": {"c": 0.0, "d": 3, "e": None},
    }


def test_a_plan_and_a_memory_report_print_json(capsys) -> None:
    code = main(["memory", SPEC, "--format", "json"])
    assert code == 0, capsys.readouterr().err
    assert strict_json(capsys.readouterr().out)


@pytest.mark.parametrize("atol, rtol", [(math.inf, 0.0), (0.0, math.nan), (-1.0, 0.0)])
def test_python_verify_refuses_a_tolerance_that_is_not_finite(atol, rtol):
    """The Python API holds the same line as the command line: ipd.verify(atol=inf) would call a
    differing model equivalent."""
    import inplace_doctor as ipd
    from inplace_doctor.examples import ResidualReLU

    with pytest.raises(ipd.UsageError, match="not a finite number >= 0"):
        ipd.verify(ResidualReLU(), torch.randn(4, 8), atol=atol, rtol=rtol)
