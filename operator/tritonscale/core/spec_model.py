"""The base of the spec's models: what the API server would accept, read the way it reads it.

A `SpecModel` is a frozen pydantic model with camelCase keys (snake_case attributes), strict
types (a boolean is not an integer, "0.1" is not a number), no unknown keys, and CEL rules
across its fields (`rules`, see tritonscale.core.rules). As the API server does, it drops
keys whose value is null before it fills in the defaults, and checks the rules on the
defaulted object. Every mistake becomes one `InvalidSpec` line that names the field by its
path: `spec.targets.utilization must be <= 1, got 1.5`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError, core_schema

from tritonscale.core.rules import Rule, first_broken

_Model = TypeVar("_Model", bound="SpecModel")


class InvalidSpec(ValueError):
    """The spec breaks a rule; the message is one line naming the field."""


class SpecModel(BaseModel):
    """One object of the spec (see the module's docstring)."""

    model_config = ConfigDict(
        alias_generator=to_camel, frozen=True, extra="forbid", allow_inf_nan=False
    )
    rules: ClassVar[tuple[Rule, ...]] = ()

    @classmethod
    def from_dict(cls: type[_Model], value: Any, path: str = "spec") -> _Model:
        """Read the camelCase form, fill in defaults, and check every rule; `path` names it."""
        try:
            return cls.model_validate(value)
        except ValidationError as error:
            raise InvalidSpec(_one_line(error.errors()[0], path)) from None

    def to_dict(self) -> dict[str, Any]:
        """The full camelCase form, defaults included (what the CRD's defaulting would show)."""
        return self.model_dump(mode="json", by_alias=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys_without_nulls(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value  # pydantic says it is not a mapping
        known = sorted(field.alias or name for name, field in cls.model_fields.items())
        for key in value:
            if key not in known:
                # A misspelt `maxInstance` would otherwise do nothing at all.
                raise PydanticCustomError(
                    "unknown_field",
                    "{key} is not a known field (known: {known})",
                    {"key": _printable(key), "known": ", ".join(known)},
                )
        return {key: item for key, item in value.items() if item is not None}

    @model_validator(mode="after")
    def _rules_hold(self) -> SpecModel:
        broken = first_broken(self.rules, self.to_dict()) if self.rules else None
        if broken is not None:
            rule, message = broken
            raise PydanticCustomError(
                "rule", "{message}", {"message": message, "field_path": rule.field_path}
            )
        return self

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> dict[str, Any]:
        json_schema = handler(schema)
        if cls.rules:
            target = handler.resolve_ref_schema(json_schema)
            target["x-kubernetes-validations"] = [rule.to_kubernetes() for rule in cls.rules]
        return json_schema


@dataclass(frozen=True)
class Matches:
    """A string constraint: `pattern` goes into the schema; a mismatch is named by `meaning`."""

    pattern: str
    meaning: str  # "a label value"

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict[str, Any]:
        json_schema = handler(schema)
        json_schema["pattern"] = self.pattern
        return json_schema

    def _check(self, value: str) -> str:
        if not re.search(self.pattern, value):
            raise PydanticCustomError(
                "pattern",
                "must be {meaning}, got {given}",
                {"meaning": self.meaning, "given": repr(value)},
            )
        return value


class Distinct:
    """A list that names each item once: `x-kubernetes-list-type: set` in the schema."""

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict[str, Any]:
        json_schema = handler(schema)
        json_schema["x-kubernetes-list-type"] = "set"
        return json_schema

    @staticmethod
    def _check(items: Sequence[Any]) -> Sequence[Any]:
        seen = set()
        for item in items:
            if item in seen:
                raise PydanticCustomError("duplicate", "lists {given} twice", {"given": repr(item)})
            seen.add(item)
        return items


# ---------------------------------------------------------------------------------------
# One line per error.


def _one_line(error: Mapping[str, Any], path: str) -> str:
    where = path + "".join(
        f"[{part}]" if isinstance(part, int) else f".{_printable(part)}"
        for part in error["loc"]
        if part != "[key]"  # pydantic's marker for "the key itself" (a matchLabels key)
    )
    kind, context, given = error["type"], error.get("ctx", {}), error["input"]
    if kind == "rule":
        return f"{where}{context['field_path']}: {context['message']}"
    if kind == "unknown_field":
        return f"{where}.{error['msg']}"
    return f"{where} {_complaint(kind, context, given, error['msg'])}"


def _complaint(kind: str, context: Mapping[str, Any], given: Any, fallback: str) -> str:
    if kind in ("pattern", "duplicate"):
        return fallback  # our own, already phrased
    if kind == "missing":
        return "is required"
    if kind == "int_type":
        return f"must be an integer, got {given!r}"
    if kind in ("float_type", "finite_number"):
        return f"must be a number, got {given!r}"
    if kind == "bool_type":
        return f"must be true or false, got {given!r}"
    if kind == "string_type":
        return f"must be a string, got {_type_name(given)}"
    if kind in ("tuple_type", "list_type"):
        return f"must be a list, got {_type_name(given)}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"must be a mapping, got {_type_name(given)}"
    if kind == "literal_error":
        return f"must be one of {context['expected']}, got {given!r}"
    bounds = {
        "greater_than_equal": (">=", "ge"),
        "greater_than": (">", "gt"),
        "less_than_equal": ("<=", "le"),
        "less_than": ("<", "lt"),
    }
    if kind in bounds:
        sign, key = bounds[kind]
        return f"must be {sign} {context[key]:g}, got {given!r}"  # 1, not 1.0
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "string_too_long":
        return f"must be at most {context['max_length']} characters long"
    if kind == "too_long":
        return f"may hold at most {context['max_length']} items, got {context['actual_length']}"
    return fallback


def _printable(key: Any) -> str:
    """A key as it reads, or its repr when it would break the line (a newline, not a string)."""
    return key if isinstance(key, str) and key.isprintable() else repr(key)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, Sequence):
        return "a list"
    return type(value).__name__
