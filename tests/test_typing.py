"""The package type-checks with mypy (STYLE.md: type hints everywhere, checked)."""

from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api")

SRC = Path(__file__).resolve().parents[1] / "src" / "inplace_doctor"


def test_package_type_checks():
    out, err, status = api.run([str(SRC), "--no-error-summary", "--cache-dir", "/tmp/inplace-doctor-mypy-cache"])
    assert status == 0, out + err
