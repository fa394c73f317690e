"""The rule catalogue. Importing this package registers every rule."""

from __future__ import annotations

from . import caller_data, forward_errors, program_meaning, saved_tensors  # noqa: F401  (registration)
from .registry import RULES, Rule, get_rule, select_rules

__all__ = ["RULES", "Rule", "get_rule", "select_rules"]
