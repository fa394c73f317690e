"""Lightning and transformers are optional: only importing their integration module imports them."""

from __future__ import annotations

import subprocess
import sys


def _imported_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(m for m in ('lightning', 'transformers', 'accelerate') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return set(done.stdout.split())


def test_importing_the_package_and_its_integrations_folder_imports_no_framework() -> None:
    assert _imported_after("import inplace_doctor, inplace_doctor.integrations") == set()


def test_the_transformers_integration_imports_no_lightning() -> None:
    # The other way round is Lightning's own doing: lightning 2.6 imports transformers when installed.
    assert "lightning" not in _imported_after("import inplace_doctor.integrations.transformers")
