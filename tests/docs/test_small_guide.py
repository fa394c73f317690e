"""docs/guide.md says what the tool does (issue 13): the GAN FAQ's rule codes, and how a factory's inputs reach the model."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.cli.main import CliUsageError, build_model

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide.md"


def _gan_faq() -> tuple[str, str]:
    """The FAQ answer on GAN training: (what it says of the plain optimizer, of Adam(fused=True))."""
    text = " ".join(GUIDE.read_text().split())
    answer = re.search(r"\*\*GAN training raises after `optimizer\.step\(\)`\.\*\*(.*?)(?:\*\*|$)", text).group(1)
    plain, fused = answer.split("With `Adam(fused=True)`")
    return plain, fused


def _broken_gan_codes(**adam: object) -> set[str]:
    """Rule codes of the broken GAN order: the discriminator steps between the generator's
    forward through it and the generator's backward."""
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 6))
    D = nn.Sequential(nn.Linear(6, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    opt_g = torch.optim.Adam(G.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(D.parameters(), lr=1e-3, **adam)  # type: ignore[arg-type]
    try:
        with ipd.watch(G, D) as session:
            fake = G(torch.randn(8, 4))
            d_out = D(fake)
            g_loss = F.binary_cross_entropy_with_logits(d_out, torch.ones_like(d_out))
            d_fake = D(fake.detach())
            d_loss = F.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake))
            opt_d.zero_grad()
            d_loss.backward()
            opt_d.step()
            opt_g.zero_grad()
            g_loss.backward()
            opt_g.step()
    except ipd.InplaceError:
        pass
    return {f.code for f in session.findings}


def test_the_gan_faq_names_the_rule_the_tool_reports() -> None:
    plain, fused = _gan_faq()
    assert _broken_gan_codes() == {"IPD101"}
    assert re.findall(r"IPD\d+", plain) == ["IPD101"], plain
    if _broken_gan_codes(fused=True) != {"IPD104"}:
        pytest.skip("this torch's fused Adam bumps version counters")
    assert re.findall(r"IPD\d+", fused) == ["IPD104"], fused


def _factory_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "small_guide_factories.py").write_text(
        "import torch\n"
        "from torch import nn\n\n"
        "class Two(nn.Module):\n"
        "    def forward(self, x, mask=None):\n"
        "        return x * mask\n\n"
        "def as_tuple():\n"
        "    return Two(), (torch.ones(2), torch.zeros(2))\n\n"
        "def as_list():\n"
        "    return Two(), [torch.ones(2), torch.zeros(2)]\n\n"
        "def as_dict():\n"
        "    return Two(), {'x': torch.ones(2), 'mask': torch.zeros(2)}\n\n"
        "def as_tensor():\n"
        "    return Two(), torch.ones(2)\n\n"
        "def as_list_pair():\n"
        "    return [Two(), torch.ones(2)]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("small_guide_factories", None)
    return "small_guide_factories"


def test_the_guide_describes_what_the_cli_does_with_a_factorys_inputs(tmp_path: Path, monkeypatch) -> None:
    mod = _factory_module(tmp_path, monkeypatch)
    for name in ("as_tuple", "as_list"):
        _, args, kwargs = build_model(f"{mod}:{name}", [], 0)
        assert len(args) == 2 and kwargs == {}, name  # unpacked: model(x, mask)
    _, args, kwargs = build_model(f"{mod}:as_dict", [], 0)
    assert args == () and set(kwargs) == {"x", "mask"}  # keyword arguments: model(x=..., mask=...)
    _, args, kwargs = build_model(f"{mod}:as_tensor", [], 0)
    assert len(args) == 1 and kwargs == {}
    with pytest.raises(CliUsageError):
        build_model(f"{mod}:as_list_pair", [], 0)
    _, args, kwargs = build_model(f"{mod}:as_dict", ["3x2"], 0)
    assert len(args) == 1 and args[0].shape == (3, 2) and kwargs == {}  # --input replaces them

    guide = " ".join(GUIDE.read_text().split())
    for said in (
        "a tuple or list is unpacked into positional arguments",
        "`return model, (x, mask)` runs `model(x, mask)`",
        "a dict is passed as keyword arguments",
        "`return model, x` runs `model(x)`",
        "a list `[model, x]` is refused",
        "`--input` (repeatable) replaces the factory's inputs entirely",
    ):
        assert said in guide, said
