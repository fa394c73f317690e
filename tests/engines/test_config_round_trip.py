"""What `optimize --write` writes, `apply_config` reads back to the same decisions: whatever the
module names hold (newlines, quotes, backslashes, glob characters, digits that become globs)."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import tomllib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.engines.optimize.plan import Decision


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


@pytest.fixture(scope="module")
def real_plan() -> ipd.Plan:
    """One real plan; each example replaces its decisions with its own model's."""
    torch.manual_seed(0)
    return ipd.optimize(Tiny(), torch.randn(2, 4), suggest_checkpoint=False)


def model_of(tree: dict[str, list[str]], root_leaves: list[str], shipped: bool) -> nn.Module:
    """A model with an nn.ReLU at each name: `root_leaves` on the root, `tree[c]` under child `c`."""
    root = nn.Module()
    for name in root_leaves:
        root.add_module(name, nn.ReLU(inplace=shipped))
    for container, leaves in tree.items():
        child = nn.Module()
        for name in leaves:
            child.add_module(name, nn.ReLU(inplace=shipped))
        root.add_module(container, child)
    return root


def planned(plan: ipd.Plan, model: nn.Module, flags: dict[str, bool | None], reason: str) -> ipd.Plan:
    """`plan` with one decision per module: the flag, or None for a module the run never executed."""
    decisions = [
        Decision(site=path, kind="module", module_type="ReLU", shipped=True, inplace=True if flag is None else flag,
                 safe=None if flag is None else True, reason=reason)
        for path, flag in flags.items()
    ]
    return dataclasses.replace(plan, decisions=decisions, all_paths=list(flags))


def written_and_applied(plan: ipd.Plan, model: nn.Module) -> tuple[dict[str, bool], dict]:
    """Write the plan's config to a file, apply it to `model`; the model's flags after, and the file's data."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "inplace.toml")
        plan.write(path)
        with open(path, "rb") as f:
            data = tomllib.load(f)
        ipd.apply_config(model, path)
    return {name: m.inplace for name, m in model.named_modules() if isinstance(m, nn.ReLU)}, data


def test_a_name_with_a_newline_reads_back(real_plan: ipd.Plan) -> None:
    model = model_of({}, ["a\nb", 'q"\\'], shipped=True)
    plan = planned(real_plan, model, {"a\nb": False, 'q"\\': True}, "a reason\nover two lines")
    flags, data = written_and_applied(plan, model)
    assert flags == {"a\nb": False, 'q"\\': True}
    assert data["inplace"] == {"a\nb": False, 'q"\\': True}


def test_names_with_glob_characters_are_written_as_literal_patterns(real_plan: ipd.Plan) -> None:
    names = ["blocks[0]", "blocks0", "a*", "ab", "x?", "xy", "[!a]", "b", "[]", "]"]
    model = model_of({}, names, shipped=True)
    wanted = {"blocks[0]": False, "blocks0": True, "a*": False, "ab": True, "x?": False, "xy": True,
              "[!a]": False, "b": True, "[]": False, "]": True}
    flags, data = written_and_applied(planned(real_plan, model, wanted, "r"), model)
    assert flags == wanted
    assert data["inplace"]["blocks[[]0]"] is False and data["inplace"]["a[*]"] is False


def test_a_literal_name_with_brackets_written_by_hand_says_how_to_name_it() -> None:
    model = model_of({}, ["blocks[0]"], shipped=True)
    with pytest.raises(ipd.UsageError, match=r"to name the module 'blocks\[0\]' itself write 'blocks\[\[\]0\]'"):
        ipd.apply_config(model, {"blocks[0]": False})


# Names a module can have (add_module refuses "." and ""; names of Module attributes are taken),
# drawn so that digits, glob characters, quotes, backslashes and control characters are common.
SPECIAL = list("01239[]*?!\"\\\n\r\t\x00\x7f #=é")
name = st.text(
    alphabet=st.sampled_from(SPECIAL) | st.characters(blacklist_categories=("Cs",), blacklist_characters="."),
    min_size=1, max_size=5,
).filter(lambda n: not hasattr(nn.Module(), n))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    names=st.lists(name, min_size=1, max_size=8, unique=True),
    containers=st.lists(name, max_size=3, unique=True),
    data=st.data(),
)
def test_what_write_writes_apply_config_reads_back_to_the_same_decisions(real_plan, names, containers, data) -> None:
    containers = [c for c in containers if c not in names]
    placed = {n: data.draw(st.sampled_from([None, *containers])) for n in names}
    tree = {c: [n for n in names if placed[n] == c] for c in containers}
    model = model_of(tree, [n for n in names if placed[n] is None], shipped=True)
    paths = [p for p, m in model.named_modules() if isinstance(m, nn.ReLU)]
    flags = {p: data.draw(st.sampled_from([True, False, None])) for p in paths}
    reason = data.draw(st.text(max_size=12))
    plan = planned(real_plan, model, flags, reason)
    for path, m in model.named_modules():  # start from the opposite of the plan: every flag must be set
        if isinstance(m, nn.ReLU):
            m.inplace = True if flags[path] is None else not flags[path]
    after, written = written_and_applied(plan, model)
    for path, flag in flags.items():
        if flag is not None:
            assert after[path] is flag, (path, plan.toml())
    assert written["inplace-doctor"]["never-executed"] == [p for p, f in flags.items() if f is None]
    assert ipd.apply_config(model, written["inplace"]) == {}  # the mapping form reads it the same
