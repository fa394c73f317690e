"""Every rule fixture (tests/rules/IPDxxx/{flagged,clean}) on CUDA: the same lines reported, the same silence.

Each fixture runs as tests/rules/test_rule_fixtures.py runs it, with its tensors and modules made on
the GPU (`with torch.device("cuda")` around it, as `torch.set_default_device` would): writes,
saves and backward's checks then happen on CUDA tensors, and backward on autograd's device thread.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _cpu_tests import load

rules = load("rules/test_rule_fixtures.py")

# Fixtures whose subject is host memory, which a CUDA tensor does not hand out: id prefix -> why.
HOST_ONLY = {
    "IPD109/": "NumPy and DLPack-to-NumPy share host memory; a CUDA tensor's `.numpy()` raises",
    "IPD106/clean/normalize_inplace_on_a_fresh_tensor.py": "torchvision's ToTensor makes a CPU tensor from a PIL image",
}


def _on_cuda(kind: str) -> list[Path]:
    return [p for p in rules.fixtures(kind) if not rules.fixture_id(p).startswith(tuple(HOST_ONLY))]


@pytest.mark.cuda
@pytest.mark.parametrize("path", _on_cuda("flagged"), ids=rules.fixture_id)
def test_flagged_fixture_on_cuda_reports_the_marked_lines(path: Path) -> None:
    rules.check_flagged(path, "cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("path", _on_cuda("clean"), ids=rules.fixture_id)
def test_clean_fixture_on_cuda_reports_nothing_of_its_rule(path: Path) -> None:
    rules.check_clean(path, "cuda")


def test_every_host_only_entry_names_fixtures_and_the_rest_run_on_cuda() -> None:
    """No stale entry, and every rule but the host-memory one keeps fixtures of both kinds on CUDA (runs on CPU too)."""
    every = [rules.fixture_id(p) for kind in ("flagged", "clean") for p in rules.fixtures(kind)]
    for prefix in HOST_ONLY:
        assert any(i.startswith(prefix) for i in every), f"HOST_ONLY entry {prefix!r} names no fixture"
    for kind in ("flagged", "clean"):
        codes = {p.parent.parent.name for p in _on_cuda(kind)}
        assert codes == {p.parent.parent.name for p in rules.fixtures(kind)} - {"IPD109"}, kind
