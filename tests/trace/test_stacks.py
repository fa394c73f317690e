"""is_user_file: which files are the user's (not torch, the standard library, inplace_doctor itself
except its bundled examples, console-script wrappers or call-wrapping packages)."""

from __future__ import annotations

import functools
import json
import os
import sysconfig

import pytest
import torch
import torch.nn.modules.linear
from conftest import marker_line

import inplace_doctor
import inplace_doctor.examples
import inplace_doctor.sites
import inplace_doctor.trace.places.stacks
from inplace_doctor.trace.places.stacks import framework_of, is_user_file

SITE_PACKAGES = os.path.dirname(os.path.dirname(torch.__file__))  # torch is installed in it
PACKAGE_DIR = os.path.dirname(inplace_doctor.__file__)


def test_this_test_file_is_the_users():
    assert is_user_file(__file__)
    assert is_user_file(os.path.abspath(__file__))


def test_torch_files_are_not_the_users():
    assert not is_user_file(torch.__file__)
    assert not is_user_file(torch.nn.modules.linear.__file__)
    assert not is_user_file(os.path.join(os.path.dirname(torch.__file__), "optim", "sgd.py"))


def test_a_package_named_like_torch_is_not_torch():
    # only files under torch/ itself are torch's: torchvision/ shares the prefix, not the directory
    assert is_user_file(os.path.join(SITE_PACKAGES, "torchvision", "models", "resnet.py"))


def test_standard_library_files_are_not_the_users():
    assert not is_user_file(os.__file__)
    assert not is_user_file(json.__file__)
    assert not is_user_file(functools.__file__)
    assert not is_user_file("<frozen importlib._bootstrap>")


def test_site_packages_inside_the_standard_library_dir_are_the_users():
    # a system Python keeps its site-packages under the stdlib directory: installed code is not stdlib
    stdlib = os.path.dirname(os.__file__)
    assert is_user_file(os.path.join(stdlib, "site-packages", "mylib", "train.py"))
    assert is_user_file(os.path.join(stdlib, "dist-packages", "mylib", "train.py"))


def test_inplace_doctors_own_modules_are_not_the_users():
    assert not is_user_file(inplace_doctor.__file__)
    assert not is_user_file(inplace_doctor.sites.__file__)
    assert not is_user_file(inplace_doctor.trace.places.stacks.__file__)
    assert not is_user_file(os.path.join(PACKAGE_DIR, "engines", "audit.py"))


def test_inplace_doctors_bundled_examples_are_the_users():
    assert inplace_doctor.examples.__file__.endswith(os.path.join("examples", "__init__.py"))
    assert is_user_file(inplace_doctor.examples.__file__)
    assert is_user_file(os.path.join(PACKAGE_DIR, "examples", "train.py"))


def test_a_sibling_directory_sharing_the_package_prefix_is_the_users():
    assert is_user_file(PACKAGE_DIR + "_plugins" + os.sep + "model.py")


def test_wrapper_packages_are_not_the_users():
    for top in ("typing_extensions.py", "decorator.py", "deprecation.py"):
        assert not is_user_file(os.path.join(SITE_PACKAGES, top))
    assert not is_user_file(os.path.join(SITE_PACKAGES, "wrapt", "decorators.py"))
    assert not is_user_file(os.path.join(SITE_PACKAGES, "deprecated", "classic.py"))


def test_other_installed_packages_are_the_users():
    assert is_user_file(os.path.join(SITE_PACKAGES, "timm", "models", "vit.py"))
    assert is_user_file(os.path.join(SITE_PACKAGES, "wrapt_helpers", "x.py"))  # only the exact top-level name


def test_installed_frameworks_that_run_the_users_code_are_not_the_users():
    for parts in (("_pytest", "runner.py"), ("pluggy", "_callers.py"), ("lightning", "pytorch", "core", "module.py"),
                  ("pytorch_lightning", "core", "module.py"), ("accelerate", "accelerator.py"),
                  ("transformers", "trainer.py")):
        assert not is_user_file(os.path.join(SITE_PACKAGES, *parts)), parts
        assert framework_of(os.path.join(SITE_PACKAGES, *parts)) is not None
    # a model library's code is where its writes are: transformers' modeling files stay the user's
    assert is_user_file(os.path.join(SITE_PACKAGES, "transformers", "models", "bert", "modeling_bert.py"))
    assert framework_of(os.path.join(SITE_PACKAGES, "pytest_plugins", "x.py")) is None  # only the exact name


def _overwrite_a_saved_tensor() -> None:
    x = torch.randn(3, 3, requires_grad=True)
    y = torch.sigmoid(x)
    y.mul_(2)  # <write>
    y.sum().backward()


def test_a_write_under_pytest_keeps_the_users_frames_and_counts_the_frameworks():
    # This test runs under pytest: pytest and pluggy frames are below it on the stack.
    with pytest.raises(inplace_doctor.InplaceError) as raised, inplace_doctor.watch():
        _overwrite_a_saved_tensor()  # <call>
    write = raised.value.findings[0].mutation
    assert [(f.function, f.line) for f in write.stack[-2:]] == [
        ("test_a_write_under_pytest_keeps_the_users_frames_and_counts_the_frameworks", marker_line(__file__, "call")),
        ("_overwrite_a_saved_tensor", marker_line(__file__, "write")),
    ]
    assert all(framework_of(f.file) is None for f in write.stack), [f.file for f in write.stack]
    assert {"pytest", "pluggy"} <= set(write.hidden_frames)
    shown = str(raised.value.written_here)  # type: ignore[attr-defined]
    files = [line for line in shown.splitlines() if line.lstrip().startswith("File ")]
    assert len(files) == len(write.stack) and not any(SITE_PACKAGES in line for line in files)


def test_console_script_wrappers_are_not_the_users():
    scripts = sysconfig.get_paths()["scripts"]
    assert not is_user_file(os.path.join(scripts, "inplace-doctor"))


def test_answer_is_stable_across_calls():
    assert [is_user_file(__file__) for _ in range(2)] == [True, True]
    assert [is_user_file(os.__file__) for _ in range(2)] == [False, False]
