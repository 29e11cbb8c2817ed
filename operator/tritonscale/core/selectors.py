"""metav1.LabelSelector helpers for the drivers: its string form and a matcher.

The selector is the dict that `AutoscalerSpec.selector` holds (checked by
`AutoscalerSpec.from_dict`): `matchLabels` and `matchExpressions`, all requirements ANDed,
with Kubernetes' semantics (`NotIn` also matches a pod without the key).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def selector_to_string(selector: Mapping[str, Any]) -> str:
    """The `labelSelector` query form the Kubernetes API takes, e.g. 'app=x,tier in (a,b)'.

    Requirements come out sorted by key, as `metav1.LabelSelectorAsSelector` sorts them, so
    the same selector always gives the same string.
    """
    requirements: list[tuple[str, str]] = []
    for key, value in selector.get("matchLabels", {}).items():
        requirements.append((key, f"{key}={value}"))
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        values = ",".join(sorted(expression.get("values", [])))
        if operator == "In":
            requirements.append((key, f"{key} in ({values})"))
        elif operator == "NotIn":
            requirements.append((key, f"{key} notin ({values})"))
        elif operator == "Exists":
            requirements.append((key, key))
        elif operator == "DoesNotExist":
            requirements.append((key, f"!{key}"))
        else:
            raise ValueError(f"unknown label selector operator {operator!r}")
    return ",".join(text for _, text in sorted(requirements))


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a pod with these labels is selected; an empty selector selects every pod."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        if not _expression_matches(expression, labels):
            return False
    return True


def _expression_matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator = expression["key"], expression["operator"]
    values = expression.get("values", [])
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    raise ValueError(f"unknown label selector operator {operator!r}")
