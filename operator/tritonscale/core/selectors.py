"""metav1.LabelSelector helpers for the drivers: its string form and a matcher.

The selector is `AutoscalerSpec.selector` (a checked `LabelSelector`): `matchLabels` and
`matchExpressions`, all requirements ANDed, with Kubernetes' semantics (`NotIn` also
matches a pod without the key).
"""

from __future__ import annotations

from collections.abc import Mapping

from tritonscale.core.spec import LabelSelector, LabelSelectorRequirement


def selector_to_string(selector: LabelSelector) -> str:
    """The `labelSelector` query form the Kubernetes API takes, e.g. 'app=x,tier in (a,b)'.

    Requirements come out sorted by key, as `metav1.LabelSelectorAsSelector` sorts them, so
    the same selector always gives the same string.
    """
    requirements: list[tuple[str, str]] = []
    for key, value in selector.match_labels.items():
        requirements.append((key, f"{key}={value}"))
    for requirement in selector.match_expressions:
        key, operator = requirement.key, requirement.operator
        values = ",".join(sorted(requirement.values))
        if operator == "In":
            requirements.append((key, f"{key} in ({values})"))
        elif operator == "NotIn":
            requirements.append((key, f"{key} notin ({values})"))
        elif operator == "Exists":
            requirements.append((key, key))
        else:  # DoesNotExist
            requirements.append((key, f"!{key}"))
    return ",".join(text for _, text in sorted(requirements))


def selector_matches(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    """Whether a pod with these labels is selected; an empty selector selects every pod."""
    for key, value in selector.match_labels.items():
        if labels.get(key) != value:
            return False
    return all(_requirement_holds(r, labels) for r in selector.match_expressions)


def _requirement_holds(requirement: LabelSelectorRequirement, labels: Mapping[str, str]) -> bool:
    key, operator, values = requirement.key, requirement.operator, requirement.values
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    return key not in labels  # DoesNotExist
