"""Which files are the user's: not torch, the standard library, inplace_doctor itself (its bundled
examples are) or its pytest plugin, console-script wrappers, call-wrapping packages, or installed frameworks that run
the user's code (pytest, Lightning, accelerate, transformers' Trainer)."""

from __future__ import annotations

import os
import sysconfig

import torch

# inplace_doctor's own files are never the user's line (its bundled examples are).
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # inplace_doctor/
# Nor its pytest plugin's, a top-level package of the same distribution installed beside it: its
# fixture calls `audit` on the test's behalf, and the test's line is the one that called the fixture.
PLUGIN_DIR = os.path.join(os.path.dirname(PACKAGE_DIR), "pytest_inplace_doctor")


def _with_real(dirs: set[str]) -> tuple[str, ...]:
    return tuple(sorted({os.path.join(p, "") for d in dirs for p in (d, os.path.realpath(d))}))


def _library_dirs() -> tuple[str, ...]:
    dirs = {os.path.dirname(torch.__file__), PACKAGE_DIR, PLUGIN_DIR}
    scripts = sysconfig.get_paths().get("scripts")  # console-script wrappers
    if scripts:
        dirs.add(scripts)
    return _with_real(dirs)


# The standard library, but not the site-packages inside it (a venv's
# platstdlib is a parent of its site-packages).
_STDLIB_DIRS = _with_real({os.path.dirname(os.__file__)})
_SITE_MARKERS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
_LIBRARY_DIRS = _library_dirs()
# The bundled examples are user code as far as locations go.
_USER_DIRS = tuple(
    os.path.join(d, "examples", "") for d in (PACKAGE_DIR, os.path.realpath(PACKAGE_DIR))
)
_is_user_file_cache: dict[str, bool] = {}


# Installed packages that only wrap calls (deprecation and decorator helpers): a frame there is the
# wrapper around the user's call (`torch.nn.utils.weight_norm` is wrapped by typing_extensions' `deprecated`).
_WRAPPER_PACKAGES = ("typing_extensions.py", "wrapt", "decorator.py", "deprecated", "deprecation.py", "functools.py")


def _is_wrapper_package(filename: str) -> bool:
    for marker in _SITE_MARKERS:
        if marker in filename:
            top = filename.split(marker, 1)[1].split(os.sep, 1)[0]
            return top in _WRAPPER_PACKAGES
    return False


# Installed frameworks that run the user's code (test runners, trainers): their frames are how the
# user's function was reached, not the user's line (`manual_backward` calls `loss.backward()` inside
# Lightning; pytest and pluggy put about 40 frames under every test; pytest-xdist's workers run them
# under execnet's).
_FRAMEWORK_PACKAGES = frozenset(
    {"pytest", "_pytest", "pluggy", "xdist", "execnet", "lightning", "pytorch_lightning", "lightning_fabric",
     "accelerate"}
)
_framework_cache: dict[str, str | None] = {}


def framework_of(filename: str) -> str | None:
    """The installed framework whose file this is (`pluggy`), or None: the user's own code, a model
    library's (`transformers`' modeling files are where their writes are) or torch's."""
    if filename in _framework_cache:
        return _framework_cache[filename]
    found = None
    for marker in _SITE_MARKERS:
        if marker in filename:
            rest = filename.split(marker, 1)[1]
            top = rest.split(os.sep, 1)[0]
            if top in _FRAMEWORK_PACKAGES:
                found = top.lstrip("_")  # pytest's code is in `_pytest`
            elif top == "transformers" and os.path.basename(rest).startswith("trainer"):
                found = top  # the Trainer's loop, not a model's code
            break
    _framework_cache[filename] = found
    return found


_PACKAGE_DIRS = _with_real({PACKAGE_DIR, PLUGIN_DIR})


def is_tool_file(filename: str) -> bool:
    """Whether a file is inplace_doctor's own code or its pytest plugin's (its bundled examples are the user's)."""
    return filename.startswith(_PACKAGE_DIRS) and not filename.startswith(_USER_DIRS)


def is_user_file(filename: str) -> bool:
    known = _is_user_file_cache.get(filename)
    if known is None:
        stdlib = filename.startswith(_STDLIB_DIRS) and not any(m in filename for m in _SITE_MARKERS)
        known = filename.startswith(_USER_DIRS) or not (
            stdlib or filename.startswith(_LIBRARY_DIRS) or filename.startswith("<frozen") or _is_wrapper_package(filename)
            or framework_of(filename) is not None
        )
        _is_user_file_cache[filename] = known
    return known
