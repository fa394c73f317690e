"""The site records (`Frame`, `Site`, `Phase`) and how a site is named and phrased for the user."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest
from conftest import marker_line

import inplace_doctor
from inplace_doctor.sites import Frame, Phase, Site, _short_path, caller_frame, describe_site, module_ref, source_line

HERE = os.path.abspath(__file__)
SCHEMA = Path(inplace_doctor.__file__).parent / "schema" / "report.schema.json"


def site(**fields: object) -> Site:
    """A site whose file is `model.py` in the working directory (printed as `model.py:42`)."""
    defaults: dict[str, object] = {"op": "aten.relu_", "file": os.path.join(os.getcwd(), "model.py"), "line": 42}
    defaults.update(fields)
    return Site(**defaults)  # type: ignore[arg-type]


# --- Phase ------------------------------------------------------------------------------------


def test_phase_compares_equal_to_plain_strings():
    assert Phase.FORWARD == "forward" and Phase.BACKWARD == "backward"
    assert Phase.BACKWARD != "forward"
    assert Phase("backward") is Phase.BACKWARD


def test_phase_serialises_and_formats_as_its_plain_string():
    assert json.dumps({"phase": Phase.BACKWARD}) == '{"phase": "backward"}'
    assert f"{Phase.FORWARD}" == "forward" and str(Phase.BACKWARD) == "backward"


def test_site_defaults_to_the_forward_phase():
    assert site().phase == Phase.FORWARD == "forward"


# --- Frame and Site records ---------------------------------------------------------------------


def test_frame_str_and_location():
    frame = Frame(os.path.join(os.getcwd(), "train.py"), 7, "main")
    assert str(frame) == f"{frame.file}:7 in main"
    assert frame.location == "train.py:7"


def test_site_location_is_short_file_and_line():
    assert site().location == "model.py:42"


def test_site_location_without_a_user_frame():
    assert Site(op="aten.add_").location == "<unknown location>"


def test_site_origin_location():
    assert site().origin_location is None
    assert site(origin=Frame(os.path.join(os.getcwd(), "net.py"), 12, "__init__")).origin_location == "net.py:12"


def test_site_equality_ignores_stack_and_origin():
    a = site(stack=(Frame("a.py", 1, "f"),), origin=Frame("a.py", 3, "__init__"))
    b = site(stack=(Frame("b.py", 2, "g"), Frame("a.py", 1, "f")), origin=None)
    assert a == b and hash(a) == hash(b)
    assert a != site(line=43)


def test_site_is_frozen():
    with pytest.raises(AttributeError):
        site().line = 1  # type: ignore[misc]


def test_to_dict_has_every_field_with_frames_and_origin():
    frames = (Frame("/x/train.py", 10, "main"), Frame("/x/model.py", 42, "forward"))
    s = Site(
        op="aten.relu_", module="layer.0.relu", module_call=2, module_type="ReLU", module_inplace=True,
        file="/x/model.py", line=42, code="return self.relu(x)", stack=frames, api="ReLU.forward",
        phase=Phase.BACKWARD, origin=Frame("/x/model.py", 5, "__init__"),
    )
    assert s.to_dict() == {
        "op": "aten.relu_",
        "form": None,
        "module": "layer.0.relu",
        "module_call": 2,
        "module_type": "ReLU",
        "file": "/x/model.py",
        "line": 42,
        "code": "return self.relu(x)",
        "api": "ReLU.forward",
        "phase": "backward",
        "stack": [
            {"file": "/x/train.py", "line": 10, "function": "main"},
            {"file": "/x/model.py", "line": 42, "function": "forward"},
        ],
        "origin": {"file": "/x/model.py", "line": 5, "function": "__init__"},
        "module_inplace": True,
        "hidden_frames": [],
        "in_compiled": False,
    }
    back = Site.from_dict(json.loads(json.dumps(s.to_dict())))  # the record again, in another process
    assert back == s and back.stack == s.stack and back.origin == s.origin and back.to_dict() == s.to_dict()


def test_to_dict_serialises_as_json_and_matches_the_report_schema():
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    site_schema = {**schema["$defs"]["site"], "$defs": schema["$defs"]}
    for s in (
        Site(op="aten.add_"),
        site(module="", module_call=1, module_type="Net", phase=Phase.BACKWARD,
             stack=(Frame("/x/a.py", 1, "<module>"),), origin=Frame("/x/a.py", 2, "<module>")),
    ):
        data = json.loads(json.dumps(s.to_dict()))
        jsonschema.validate(data, site_schema)
    assert data["phase"] == "backward" and data["origin"] == {"file": "/x/a.py", "line": 2, "function": "<module>"}


def test_to_dict_without_origin_or_stack():
    data = Site(op="aten.add_").to_dict()
    assert data["origin"] is None and data["stack"] == [] and data["phase"] == "forward"


# --- module_ref ---------------------------------------------------------------------------------


def test_module_ref_with_a_root_label():
    assert module_ref(site(module="layer1.0.relu"), "model") == "model.layer1.0.relu"


def test_module_ref_without_a_root_label_is_the_bare_path():
    assert module_ref(site(module="D.2"), "") == "D.2"


def test_module_ref_of_the_root_itself():
    assert module_ref(site(module=""), "model") == "model"
    assert module_ref(site(module=""), "") == "<root module>"


def test_module_ref_outside_any_module():
    assert module_ref(site(module=None), "model") is None


# --- describe_site ------------------------------------------------------------------------------


def test_describe_site_names_op_module_class_and_location():
    s = site(module="layer.0.relu", module_call=1, module_type="ReLU", api="ReLU.forward")
    assert describe_site(s, "model") == "`relu_` in model.layer.0.relu (ReLU) at model.py:42"


def test_describe_site_second_call_of_a_module():
    s = site(module="features.3", module_call=2, module_type="ReLU")
    assert describe_site(s, "model") == "`relu_` in model.features.3 (ReLU, call 2) at model.py:42"


def test_describe_site_call_without_a_class():
    assert describe_site(site(module="act", module_call=3), "model") == "`relu_` in model.act (call 3) at model.py:42"


def test_describe_site_names_the_torch_api_unless_a_forward():
    step = site(op="aten.add_", api="SGD.step")
    assert describe_site(step, "model") == "`add_` (via SGD.step) at model.py:42"
    fwd = site(module="act", module_type="ReLU", api="ReLU.forward")
    assert "via" not in describe_site(fwd, "model")


def test_describe_site_during_backward():
    s = site(op="aten.mul_", phase=Phase.BACKWARD)
    assert describe_site(s, "model") == "`mul_` at model.py:42 during backward"
    # a plain string phase reads the same
    assert describe_site(site(op="aten.mul_", phase="backward"), "model") == "`mul_` at model.py:42 during backward"
    assert "during" not in describe_site(site(), "model")


def test_describe_site_slot_and_root_module():
    s = site(op="aten.copy_", module="", module_type="Net")
    assert describe_site(s, "model", slot="self") == "`copy_` -> self in model (Net) at model.py:42"
    assert describe_site(s, "") == "`copy_` in <root module> (Net) at model.py:42"


def test_describe_site_everything_together():
    s = site(op="aten.add_", module="opt", module_call=2, module_type="Wrapper", api="SGD.step", phase="backward")
    assert describe_site(s, "G") == "`add_` (via SGD.step) in G.opt (Wrapper, call 2) at model.py:42 during backward"


def test_describe_site_unknown_location():
    assert describe_site(Site(op="aten.relu_"), "model") == "`relu_` at <unknown location>"


# --- _short_path --------------------------------------------------------------------------------


def test_short_path_relative_to_the_working_directory(tmp_path, monkeypatch):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    assert _short_path(str(work / "pkg" / "model.py")) == os.path.join("pkg", "model.py")
    assert _short_path(str(tmp_path / "a" / "near.py")) == os.path.join("..", "near.py")


def test_short_path_stays_absolute_when_far(tmp_path, monkeypatch):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    far = str(tmp_path / "far.py")  # ../../far.py
    assert _short_path(far) == far


def test_short_path_of_an_installed_package_is_its_import_path():
    path = os.path.join(os.sep, "opt", "venv", "lib", "python3.11", "site-packages", "timm", "models", "vit.py")
    assert _short_path(path) == os.path.join("timm", "models", "vit.py")


# --- caller_frame -------------------------------------------------------------------------------


def test_caller_frame_is_the_first_outer_frame_in_another_file():
    train = Frame("/x/train.py", 30, "main")
    step = Frame("/x/train.py", 12, "step")
    forward = Frame("/x/model.py", 40, "forward")
    helper = Frame("/x/model.py", 20, "helper")
    assert caller_frame(site(stack=(train, step, forward, helper))) is step


def test_caller_frame_falls_back_to_the_direct_caller():
    outer, inner = Frame("/x/train.py", 30, "main"), Frame("/x/train.py", 12, "step")
    assert caller_frame(site(stack=(outer, inner))) is outer


def test_caller_frame_needs_two_frames():
    assert caller_frame(site(stack=())) is None
    assert caller_frame(site(stack=(Frame("/x/train.py", 1, "main"),))) is None


# --- source_line --------------------------------------------------------------------------------


def test_source_line_is_the_stripped_text():
    value = 1 + 1  # <probe>
    assert value == 2
    line = marker_line(__file__, "probe")
    assert source_line(Frame(HERE, line, "test")) == "value = 1 + 1  # <probe>"


def test_source_line_missing():
    assert source_line(None) is None
    assert source_line(Frame(HERE, 10**6, "test")) is None
    assert source_line(Frame("/no/such/file.py", 1, "f")) is None
