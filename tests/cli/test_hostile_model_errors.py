"""A model that raises, seen through every subcommand that runs it: exit 3, the model's
traceback, then one line naming its exception and how far the tool got (as `audit` already did);
and a model spec naming no module at all: exit 2, one line.
"""

from __future__ import annotations

import pytest

from inplace_doctor.cli.main import main

FACTORY_MODULE = "ipd_hostile_model_factories"
FACTORY_SOURCE = '''
import torch
from torch import nn


class RaisesInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        raise ValueError("forward failed on purpose")


def raises_in_forward():
    return RaisesInForward(), torch.randn(2, 4)
'''


@pytest.fixture
def factories(factory_module):
    factory_module(FACTORY_MODULE, FACTORY_SOURCE)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", ["verify", "memory", "optimize"])
def test_a_model_raising_in_forward_exits_3_with_one_line_like_audit(capsys, factories, command):
    code, out, err = run_cli(capsys, command, f"{FACTORY_MODULE}:raises_in_forward", "--steps", "1")
    assert code == 3, err
    assert out == ""
    lines = err.splitlines()
    assert "Traceback" in err and "forward failed on purpose" in lines[-2]  # the model's own traceback first
    last = lines[-1]
    assert last.startswith("inplace-doctor: RaisesInForward raised ValueError during ")
    assert f"during {command} (" in last  # how far the tool got
    assert last.endswith(": forward failed on purpose")


def test_memory_of_a_step_hitting_pytorchs_inplace_error_exits_3_and_points_to_audit(capsys):
    spec = "inplace_doctor.examples:sigmoid_then_relu"
    code, out, err = run_cli(capsys, "memory", spec)
    assert code == 3
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith("inplace-doctor: ")
    assert "PyTorch's in-place error" in line
    assert "modified by an inplace operation" in line  # PyTorch's own words are kept
    assert f"`inplace-doctor audit {spec}` to name both culprits" in line


def test_a_spec_naming_no_module_is_one_usage_line(capsys):
    code, out, err = run_cli(capsys, "audit", "rtm:nope")
    assert code == 2
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith("inplace-doctor: error: cannot import module 'rtm'")
    assert "no importable module has a name close to 'rtm'" in line


def test_a_misspelt_module_still_gets_the_closest_name(capsys):
    code, _, err = run_cli(capsys, "audit", "inplace_doctr.examples:sigmoid_then_relu")
    assert code == 2
    [line] = err.splitlines()
    assert "did you mean 'inplace_doctor.examples'?" in line
