"""Rules across fields, written once in CEL: the API server and `from_dict` evaluate the same text.

A `Rule` is one entry of a CRD schema's `x-kubernetes-validations`. The CRD carries it as
it is; in Python, cel-python evaluates it on the same (defaulted) object, so a spec the
operator refuses is a spec the API server refuses, with the same message.

Write rules in standard CEL (no Kubernetes extension library: cel-python lacks them), and
only over fields whose lists and strings have a `maxItems`/`maxLength`, so that the API
server can bound the rule's cost when it compiles the CRD.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import celpy

_CEL = celpy.Environment()


@dataclass(frozen=True)
class Rule:
    """`rule` must hold for `self`; when it does not, the message says why, in one line.

    Give either a fixed `message` or a `message_expression` (CEL that returns the message,
    to name the values). `field_path` (".minInstances") points the error at one field.
    `shows` names fields whose values Python adds to the message: a message expression may
    not turn a number into a string, since the API server estimates the cost of `string(int)`
    as unbounded and refuses the CRD (kubernetes/kubernetes#124234).
    """

    rule: str
    message: str = ""
    message_expression: str = ""
    field_path: str = ""
    shows: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if bool(self.message) == bool(self.message_expression):
            raise ValueError(f"rule {self.rule!r}: give a message or a message_expression")

    def to_kubernetes(self) -> dict[str, str]:
        """The `x-kubernetes-validations` entry."""
        entry = {"rule": self.rule}
        if self.message_expression:
            entry["messageExpression"] = self.message_expression
        else:
            entry["message"] = self.message
        if self.field_path:
            entry["fieldPath"] = self.field_path
        return entry


def first_broken(rules: Sequence[Rule], value: Any) -> tuple[Rule, str] | None:
    """The first rule `value` (the object as JSON, camelCase) breaks, and its message."""
    if not rules:
        return None
    activation = {"self": celpy.json_to_cel(value)}
    for rule in rules:
        if not _evaluate(rule.rule, activation):
            message = rule.message
            if rule.message_expression:
                message = str(_evaluate(rule.message_expression, activation))
            if rule.shows:
                message += f" ({', '.join(f'{name} is {value[name]}' for name in rule.shows)})"
            return rule, message
    return None


@functools.cache
def _program(expression: str) -> celpy.Runner:
    return _CEL.program(_CEL.compile(expression))


def _evaluate(expression: str, activation: dict[str, Any]) -> Any:
    result = _program(expression).evaluate(activation)
    if isinstance(result, celpy.CELEvalError):
        raise result  # a rule that cannot be evaluated on a valid object is a bug in the rule
    return result
