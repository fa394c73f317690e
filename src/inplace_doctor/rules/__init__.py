"""The rules: what the tracer's events mean, as records.

One rule is a function registered with `@rule(...)` whose docstring is its documentation
(`inplace-doctor rule CODE`, docs/rules/). Every module of this folder is imported here, so that
the rule modules among them register their rules; the others are the machinery: `registry`
(codes, selection, `make_finding`), `dispatch` (the Analyzer that routes events to rules, folds
findings and confirms predictions), `suppress` (comments and regions), `phrasing` (how a place is
named: a finding's `places`; the sentences of findings are render/explain/'s). `fixes/` holds the
fixes' builders and the source they read. A new rule is one new file plus its explainer in
render/explain/ and its fixtures under tests/rules/IPDxxx/ (docs/architecture.md, "Adding a
rule"). Rules may import the records and trace/ (for stacks), never engines/, render/ or cli/.
"""

from __future__ import annotations

import importlib
import pkgutil

from .registry import RULES, Rule, fast_mode_rules, get_rule, needing_deep_mode, select_rules

MACHINERY = frozenset({"registry", "dispatch", "suppress", "phrasing"})

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module not in MACHINERY:
        importlib.import_module(f"{__name__}.{_module}")  # registers its rules

#: the rules the fast tracer serves, as registered (`fast_mode_rules()` asks again)
FAST_MODE_RULES = fast_mode_rules()

__all__ = ["FAST_MODE_RULES", "RULES", "Rule", "fast_mode_rules", "get_rule", "needing_deep_mode", "select_rules"]
