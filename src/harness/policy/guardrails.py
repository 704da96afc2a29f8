"""Guardrail rules: block or escalate a call by the value of one of its arguments (SPEC G1)."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from typing import Any

from harness.domain.plans import refs_in
from harness.policy.config import Guardrail
from harness.policy.shell import wipes

_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "gt": operator.gt, "ge": operator.ge, "lt": operator.lt, "le": operator.le,
    "eq": operator.eq, "ne": operator.ne,
}


class Unknown:
    """An argument whose value is only known at execution time (it references an earlier step)."""


UNKNOWN = Unknown()


def argument_value(arguments: dict[str, Any], name: str) -> Any:
    """The argument's value, UNKNOWN when it is a `$ref`, None when absent."""
    value = arguments.get(name)
    return UNKNOWN if refs_in(value) else value


def matches(rule: Guardrail, value: Any) -> bool:
    """Whether a known argument value trips the rule. Type mismatches trip it (fail closed)."""
    if value is None:
        return False
    if rule.op == "shell_wipes":
        return wipes(str(value), rule.protected) is not None
    if rule.op == "matches":
        return re.search(str(rule.value), str(value)) is not None
    if rule.op == "contains":
        return str(rule.value) in str(value)
    try:
        return bool(_COMPARE[rule.op](value, rule.value))
    except TypeError:
        return True
