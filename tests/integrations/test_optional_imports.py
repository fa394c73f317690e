"""Lightning and transformers are optional: only importing their integration module imports them."""

from __future__ import annotations

import subprocess
import sys


def _imported_after(statement: str, watched: tuple[str, ...] = ("lightning", "transformers", "accelerate")) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(m for m in {watched!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return set(done.stdout.split())


def test_importing_the_package_and_its_integrations_folder_imports_no_framework() -> None:
    assert _imported_after("import inplace_doctor, inplace_doctor.integrations") == set()


def test_the_transformers_integration_imports_no_lightning() -> None:
    # The other way round is Lightning's own doing: lightning 2.6 imports transformers when installed.
    assert "lightning" not in _imported_after("import inplace_doctor.integrations.transformers")


def test_the_cli_imports_neither_dynamo_nor_fsdp() -> None:
    # FSDP imports torch._dynamo: about a second at every start of the tool, before it does anything
    heavy = ("torch._dynamo", "torch.distributed.fsdp")
    assert _imported_after("import torch, inplace_doctor.cli.main", heavy) == set()


def test_the_framework_files_whose_writes_are_state_syncs_are_the_files_of_those_modules() -> None:
    import importlib

    from inplace_doctor.trace.places import stacks

    for name in ("torch.nn.parallel.distributed", "torch.distributed.fsdp._fully_shard._fsdp_collectives"):
        try:
            file = importlib.import_module(name).__file__
        except ImportError:  # torch built without distributed support
            continue
        assert file in stacks._SYNC_FUNCTIONS, (file, sorted(stacks._SYNC_FUNCTIONS))
