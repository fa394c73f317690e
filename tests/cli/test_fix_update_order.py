"""Moves that change what accumulates (issue 37, item 7): for an update that overwrote what a later
backward saved (an actor-critic step, a GAN step), `fix` tries the reorder such projects adopt
(the later update, its `zero_grad`, backward and step, moved first, from the same forward) before
moving the step after the backward; the evidence names the parameter whose gradient differs, and a
move written unproven says what its parameters then train on."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from programs import git_project

pytestmark = pytest.mark.slow

# DDPG's shape: each update starts with its own zero_grad; the critic's step overwrites the weights
# the actor's loss saved. The projects' fix: update the actor first.
DDPG = textwrap.dedent(
    """\
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    actor = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2), nn.Tanh())
    critic = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
    a_opt = torch.optim.Adam(actor.parameters(), lr=1e-3)
    c_opt = torch.optim.Adam(critic.parameters(), lr=1e-3)

    for step in range(3):
        s, a, r = torch.randn(8, 4), torch.randn(8, 2), torch.randn(8, 1)
        critic_loss = (critic(torch.cat([s, a], 1)) - r).pow(2).mean()
        actor_loss = -critic(torch.cat([s, actor(s)], 1)).mean()

        # critic update
        c_opt.zero_grad()
        critic_loss.backward()
        c_opt.step()

        # actor update
        a_opt.zero_grad()
        actor_loss.backward()
        a_opt.step()
    print(f"done {critic_loss.item():.6f} {actor_loss.item():.6f}")
    """
)

# A GAN step written the same way: the generator's loss reads the discriminator before its step.
GAN = textwrap.dedent(
    """\
    import torch
    from torch import nn

    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(8, 32), nn.LeakyReLU(0.2), nn.Linear(32, 4))
    D = nn.Sequential(nn.Linear(4, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    g_opt = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    d_opt = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    bce = nn.BCEWithLogitsLoss()
    for it in range(3):
        real, z = torch.randn(16, 4), torch.randn(16, 8)
        fake = G(z)
        d_loss = bce(D(real), torch.ones(16, 1)) + bce(D(fake.detach()), torch.zeros(16, 1))
        g_loss = bce(D(fake), torch.ones(16, 1))
        d_opt.zero_grad(); d_loss.backward(); d_opt.step()
        g_opt.zero_grad(); g_loss.backward(); g_opt.step()
    print("ok")
    """
)


def fix(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inplace_doctor", "fix", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def python(script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, script.name], cwd=script.parent, capture_output=True, text=True, timeout=300)


def test_the_later_update_moved_first_is_proven_and_written(tmp_path: Path) -> None:
    project = git_project(tmp_path, {"train.py": DDPG})
    assert "modified by an inplace operation" in python(project / "train.py").stderr
    done = fix("train.py", cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("fixed IPD101 at train.py:18: move `a_opt.zero_grad(); actor_loss.backward(); a_opt.step()` "
            "(train.py:21-23) to before line 15 (proven:") in done.stdout, done.stdout
    text = (project / "train.py").read_text()
    body = text[text.index("    # actor update") :]
    assert body.startswith(
        "    # actor update\n    a_opt.zero_grad()\n    actor_loss.backward()\n    a_opt.step()\n\n"
        "    # critic update\n    c_opt.zero_grad()\n    critic_loss.backward()\n    c_opt.step()\n"
        "print("
    ), body
    ran = python(project / "train.py")
    assert ran.returncode == 0 and ran.stdout.startswith("done "), ran.stderr


def test_the_move_after_the_backward_is_refused_naming_the_critic_parameter_whose_gradient_differs(
    tmp_path: Path,
) -> None:
    # zero_grad of both at the top: moved first, the actor's backward leaves its gradient in the
    # critic's .grad and the critic's step applies it; moved after, the same. Neither is proven.
    program = DDPG.replace("    c_opt.zero_grad()\n", "").replace("    a_opt.zero_grad()\n", "")
    program = program.replace("for step in range(3):\n", "for step in range(3):\n    c_opt.zero_grad(); a_opt.zero_grad()\n")
    assert program.count("zero_grad") == 2
    project = git_project(tmp_path, {"train.py": program})
    done = fix("train.py", cwd=project)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("inplace-doctor: not applied")]
    assert len(lines) == 2, done.stdout
    assert all("gradient of critic." in line and "differs from the intended program's" in line for line in lines), lines
    assert (project / "train.py").read_text() == program
    unsafe = fix("--unsafe-fixes", "train.py", cwd=project)
    applied = [line for line in unsafe.stdout.splitlines() if line.startswith("fixed ")]
    assert len(applied) == 1 and "unsafe, applied by --unsafe-fixes" in applied[0], unsafe.stdout
    assert "gradient of critic." in applied[0] and "they then also train on that loss" in applied[0], applied[0]
    assert unsafe.returncode == 1


def test_a_gan_step_gets_the_generator_update_first(tmp_path: Path) -> None:
    project = git_project(tmp_path, {"gan.py": GAN})
    done = fix("gan.py", cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "move `g_opt.zero_grad(); g_loss.backward(); g_opt.step()` (gan.py:16) to before line 15 (proven:" in done.stdout
    text = (project / "gan.py").read_text()
    assert text.index("g_loss.backward()") < text.index("d_loss.backward()")
    assert python(project / "gan.py").stdout == "ok\n"
