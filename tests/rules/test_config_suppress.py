"""[tool.inplace-doctor] in pyproject.toml, suppression comments, regions and per-module ignores."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.cli.project import load_project_config, merged
from inplace_doctor.examples import ResidualReLU


class CommentSuppressed(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(x)
        y.mul_(2)  # inplace-doctor: ignore[IPD101]
        return y


class CommentForOtherCode(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(x)
        y.mul_(2)  # inplace-doctor: ignore[IPD105]
        return y


def test_a_comment_on_the_overwriting_line_suppresses_its_code_only() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    assert ipd.audit(CommentSuppressed(), x).codes == []
    assert ipd.audit(CommentForOtherCode(), x).codes == ["IPD101"]


def test_a_region_suppresses_inside_it_only() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    with ipd.suppress("IPD1"):
        assert ipd.audit(CommentForOtherCode(), x).codes == []
    assert ipd.audit(CommentForOtherCode(), x).codes == ["IPD101"]

    @ipd.suppress("IPD101")
    def audited() -> list[str]:
        return ipd.audit(CommentForOtherCode(), x).codes

    assert audited() == []
    with pytest.raises(ipd.UsageError, match="did you mean IPD105"):
        ipd.suppress("IPD15x")


def test_per_module_ignores_match_module_path_globs() -> None:
    x = torch.randn(4, 8)
    assert ipd.audit(ResidualReLU(), x).codes == ["IPD105"]
    assert ipd.audit(ResidualReLU(), x, per_module_ignores={"model.act": ["IPD105"]}).codes == []
    assert ipd.audit(ResidualReLU(), x, per_module_ignores={"ac*": ["IPD1"]}).codes == []
    assert ipd.audit(ResidualReLU(), x, per_module_ignores={"other.*": ["IPD105"]}).codes == ["IPD105"]


def write_pyproject(folder: Path, body: str) -> None:
    (folder / "pyproject.toml").write_text("[project]\nname = 'x'\n\n[tool.inplace-doctor]\n" + textwrap.dedent(body))


def test_config_is_found_by_walking_up_and_validated(tmp_path: Path) -> None:
    write_pyproject(tmp_path, 'ignore = ["IPD104"]\nfail-on = "error"\nper-module-ignores = { "model.act" = ["IPD105"] }\n')
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    config = load_project_config(deep)
    assert config.ignore == ["IPD104"] and config.fail_on == "error"
    assert config.per_module_ignores == {"model.act": ["IPD105"]}
    assert merged(config, None, ["IPD101"], "never").ignore == ["IPD101"]  # flags win
    write_pyproject(tmp_path, 'ignroe = ["IPD104"]\n')
    with pytest.raises(ipd.UsageError, match="unknown key 'ignroe'; did you mean 'ignore'"):
        load_project_config(deep)
    write_pyproject(tmp_path, 'select = ["IPD1011"]\n')
    with pytest.raises(ipd.UsageError, match="did you mean IPD1[01]1"):
        load_project_config(deep)
    write_pyproject(tmp_path, 'fail-on = "warn"\n')
    with pytest.raises(ipd.UsageError, match="did you mean 'warning'"):
        load_project_config(deep)


def test_cli_run_reads_the_config_and_flags_override_it(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent("""
        import torch
        from inplace_doctor.examples import ResidualReLU
        ResidualReLU()(torch.randn(4, 8))
    """))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "inplace_doctor", "run", *args, str(script)],
            capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"},
        )

    write_pyproject(tmp_path, 'per-module-ignores = { "ResidualReLU.act" = ["IPD105"] }\n')
    assert run().returncode == 0
    write_pyproject(tmp_path, 'fail-on = "never"\n')
    done = run()
    assert done.returncode == 0 and "IPD105" in done.stderr  # reported, not failing
    assert run("--fail-on", "warning").returncode == 1
    write_pyproject(tmp_path, 'colour = "red"\n')
    done = run()
    assert done.returncode == 2 and "unknown key 'colour'" in done.stderr


def test_cli_audit_reads_the_config_too(tmp_path: Path, monkeypatch, capsys) -> None:
    from inplace_doctor.cli.main import main

    monkeypatch.chdir(tmp_path)
    spec = "inplace_doctor.examples:sigmoid_then_relu"
    write_pyproject(tmp_path, 'fail-on = "never"\n')
    assert main(["audit", spec]) == 0 and "IPD101" in capsys.readouterr().out
    assert main(["audit", spec, "--fail-on", "error"]) == 1
    write_pyproject(tmp_path, 'ignore = ["IPD101"]\n')
    assert main(["audit", spec]) == 0
    assert main(["audit", spec, "--ignore", "IPD105"]) == 1  # the flag replaces the file's list
    capsys.readouterr()


def test_cli_config_option_sets_the_flags_before_audit_and_verify(tmp_path: Path, monkeypatch, capsys) -> None:
    from inplace_doctor.cli.main import main

    monkeypatch.chdir(tmp_path)
    spec = "inplace_doctor.examples:sigmoid_then_relu"
    (tmp_path / "inplace.toml").write_text('[inplace]\n"act" = false\n')
    assert main(["audit", spec]) == 1
    capsys.readouterr()
    assert main(["audit", spec, "--config", "inplace.toml"]) == 0
    captured = capsys.readouterr()
    assert "applied inplace.toml: 1 flag(s) changed: act -> off" in captured.err
    assert "IPD101" not in captured.out
    assert main(["verify", "inplace_doctor.examples:residual_relu", "--config", "inplace.toml"]) == 0
    (tmp_path / "typo.toml").write_text('[inplace]\n"actt" = false\n')
    assert main(["audit", spec, "--config", "typo.toml"]) == 2
    assert "did you mean 'act'" in capsys.readouterr().err
    assert main(["verify", spec, "--config", "missing.toml"]) == 2
    assert "config file 'missing.toml' does not exist" in capsys.readouterr().err


def test_the_clone_fix_names_the_written_variable_and_drops_the_comment() -> None:
    from inplace_doctor.render.explain.phrasing import without_comment

    assert without_comment("feats[:, 3:] = 0  # pad") == "feats[:, 3:] = 0"
    assert without_comment("s = '#not a comment'") == "s = '#not a comment'"

    class Pad(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            feats = torch.sigmoid(x)
            feats[:, 3:] = 0  # zero the padding
            return feats

    (finding,) = ipd.audit(Pad(), torch.randn(2, 5, requires_grad=True)).findings
    assert "write into a copy (`feats = feats.clone()` before `feats[:, 3:] = 0`)" in finding.fix
