"""`inplace-doctor rules` (the catalogue, one line a rule) and `inplace-doctor rule CODE` (one rule's documentation)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .errors import EXIT_OK

if TYPE_CHECKING:
    from .args import Subcommands


def add_parsers(sub: Subcommands) -> None:
    rules = sub.add_parser("rules", help="list the rules")
    rules.set_defaults(handler=list_rules)
    rule = sub.add_parser("rule", help="print one rule's documentation")
    rule.add_argument("code")
    rule.set_defaults(handler=show_rule)


def list_rules(ns: argparse.Namespace) -> int:
    from ..api import RULES

    for code, r in sorted(RULES.items()):
        print(f"{code}  {r.severity.value:<8} {r.name:<36} {r.summary}")
    return EXIT_OK


def show_rule(ns: argparse.Namespace) -> int:
    from ..api import get_rule

    r = get_rule(ns.code)
    print(f"{r.code} ({r.name}, {r.severity.value}): {r.title}\n\n{r.doc}")
    return EXIT_OK
