"""Programs several CLI test modules run, written once, and the git project they run in."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path


def git_project(tmp_path: Path, files: dict[str, str | bytes]) -> Path:
    """`files` written into `tmp_path`, made a git repository with them committed (as `fix` wants)."""
    for name, text in files.items():
        if isinstance(text, bytes):
            (tmp_path / name).write_bytes(text)
        else:
            (tmp_path / name).write_text(text)
    for cmd in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start"]):
        subprocess.run(["git", *cmd], cwd=tmp_path, check=True, capture_output=True)
    return tmp_path

# A SAC/DDPG-style step: the critic's step overwrites the weight the actor's loss saved. Where the
# Polyak update (reading the stepped critic) goes is a slot: between that step and the actor's
# backward (POLYAK_HERE), or after the actor's step (POLYAK_LAST).
ACTOR_CRITIC_SLOTS = textwrap.dedent(
    """\
    import torch
    from torch import nn

    torch.manual_seed(0)
    critic, actor, target = nn.Linear(4, 1), nn.Linear(4, 4), nn.Linear(4, 1)
    target.load_state_dict(critic.state_dict())
    c_opt = torch.optim.SGD(critic.parameters(), lr=0.1)
    a_opt = torch.optim.SGD(actor.parameters(), lr=0.1)
    for step in range(3):
        s = torch.randn(8, 4)
        with torch.no_grad():
            y = target(s) * 0.9 + 1
        critic_loss = (critic(s) - y).pow(2).mean()
        critic.requires_grad_(False)
        actor_loss = -critic(actor(s)).mean()  # saves the critic's weight
        critic.requires_grad_(True)
        c_opt.zero_grad()
        a_opt.zero_grad()
        critic_loss.backward()
        c_opt.step()  # overwrites it before the actor's backward
    POLYAK_HERE
        actor_loss.backward()
        a_opt.step()
    POLYAK_LAST
    """
)
POLYAK = """\
    with torch.no_grad():  # Polyak: reads the stepped critic
        for p, t in zip(critic.parameters(), target.parameters()):
            t.mul_(0.9).add_(0.1 * p)"""


# The program with the Polyak update between the critic's step and the actor's backward.
ACTOR_CRITIC = (
    ACTOR_CRITIC_SLOTS.replace("POLYAK_HERE\n", POLYAK + "\n").replace("POLYAK_LAST\n", "")
    + "print(target.weight.tolist())\n"
)


# `mul` saves views of `buf`, and the assignment then writes `buf`: a clone before the statement
# cannot help (the clone is both read and written).
BUFFER_STEPS = textwrap.dedent(
    """\
    import torch

    torch.manual_seed(0)
    x = torch.randn(8, requires_grad=True)
    opt = torch.optim.SGD([x], lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        buf = x * 1.5
        buf[4] = torch.mul(buf[2], buf[3])  # mul saves views of buf; the assignment writes buf
        buf.sum().backward()
        opt.step()
    """
)
BUFFER = BUFFER_STEPS + "print(x.tolist())\n"


# The bundled example (the README's) trained 2 steps instead of 20, for tests where it stands for "a
# program with one fixable finding": each run of it in a check is a fresh Python that imports torch,
# and its steps are the part of that cost a test can drop.
BROKEN_TRAIN = Path(__file__).resolve().parents[2] / "examples" / "broken_train.py"
TWO_STEP_TRAIN = BROKEN_TRAIN.read_text().replace("for _step in range(1, 21):", "for _step in range(1, 3):")
assert BROKEN_TRAIN.read_text() != TWO_STEP_TRAIN
