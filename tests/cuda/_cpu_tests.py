"""The CPU tests' helpers that the CUDA tests reuse, loaded from their files.

tests/ holds no packages: a folder's modules import each other by bare name, and only tests/
itself is on `sys.path` for every folder (for `conftest`). A CUDA test runs a CPU test's own
check on the GPU, so it loads that module by path under a private name.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TESTS = Path(__file__).resolve().parent.parent


def load(relative: str) -> ModuleType:
    """The module at tests/`relative` (`rules/test_rule_fixtures.py`), imported once."""
    name = "_cuda_uses_" + relative.removesuffix(".py").replace("/", "_")
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, TESTS / relative)
        assert spec is not None and spec.loader is not None, relative
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module
