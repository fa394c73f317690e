"""`inplace-doctor myths [NAME]`: run the myth experiments shipped in `inplace_doctor/myths/` and print the table."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .args import Subcommands


def add_parser(sub: Subcommands) -> None:
    myths = sub.add_parser("myths", help="run the experiments that check the folklore about in-place ops")
    myths.add_argument("name", nargs="?", default="", help="only experiments whose name starts with this")
    myths.set_defaults(handler=command)


def command(ns: argparse.Namespace) -> int:
    from ..myths import main

    return main([ns.name] if ns.name else [])
