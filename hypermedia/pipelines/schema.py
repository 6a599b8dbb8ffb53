"""Settings schemas as data: what a profile may set and what a job may override.

A pipeline declares its settings as ``{name: Field}``.  The same declaration
checks a profile version when it is created (unknown keys, types, ranges,
choices: a 100,000-pixel thumbnail or quality 500 is refused) and merges a
job's ``params`` over its profile's settings at enqueue (only fields marked
``overridable``).  The merged values are what the job stores and runs with.
Fields marked ``private`` name the server's own machinery (a daemon's
socket): the API and the dashboard show them to admin tokens only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hypermedia.errors import JobError

Settings = dict[str, Any]


@dataclass(frozen=True)
class Field:
    kind: type  # int, float, str or bool
    default: Any
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] | None = None
    overridable: bool = True  # may a job's params set it?
    private: bool = False  # the operator's business: shown to admin tokens only
    doc: str = ""

    def check(self, name: str, value: Any) -> Any:
        if self.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, self.kind) or (self.kind is not bool and isinstance(value, bool)):
            raise JobError("INVALID_PARAMS", f"{name} must be {_kind_name(self.kind)}")
        if self.choices is not None and value not in self.choices:
            raise JobError("INVALID_PARAMS", f"{name} must be one of {_list(self.choices)}")
        number: Any = value
        too_low = self.low is not None and number < self.low
        too_high = self.high is not None and number > self.high
        if too_low or too_high:
            raise JobError("INVALID_PARAMS", f"{name} must be from {self.low} to {self.high}")
        return value

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": _kind_name(self.kind), "default": self.default}
        if self.low is not None:
            out["min"] = self.low
        if self.high is not None:
            out["max"] = self.high
        if self.choices is not None:
            out["choices"] = list(self.choices)
        out["overridable"] = self.overridable
        if self.private:
            out["private"] = True
        if self.doc:
            out["doc"] = self.doc
        return out


Schema = Mapping[str, Field]


def clean_settings(schema: Schema, settings: Mapping[str, Any]) -> Settings:
    """A profile's settings, checked and completed with defaults."""
    unknown = set(settings) - set(schema)
    if unknown:
        raise JobError("INVALID_PARAMS", f"unknown settings: {_list(sorted(unknown))}")
    return {name: f.check(name, settings.get(name, f.default)) for name, f in schema.items()}


def merge_params(
    schema: Schema, settings: Mapping[str, Any], params: Mapping[str, Any]
) -> Settings:
    """The values a job runs with: its profile's settings, overridden by ``params``."""
    unknown = set(params) - set(schema)
    if unknown:
        raise JobError("INVALID_PARAMS", f"unknown parameters: {_list(sorted(unknown))}")
    fixed = sorted(k for k in params if not schema[k].overridable)
    if fixed:
        raise JobError("INVALID_PARAMS", f"set by the profile, not by a job: {_list(fixed)}")
    base = clean_settings(schema, {k: v for k, v in settings.items() if k in schema})
    return {**base, **{k: schema[k].check(k, v) for k, v in params.items()}}


def validator(schema: Schema, check: Any = None) -> Any:
    """A Pipeline.validate built from ``schema``; ``check(values)`` adds cross-field rules."""

    def validate(params: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
        values = merge_params(schema, settings, params)
        if check is not None:
            check(values)
        return values

    return validate


def public(schema: Schema, values: Mapping[str, Any]) -> Settings:
    """``values`` without the private fields (what a non-admin token may see)."""
    return {k: v for k, v in values.items() if not (k in schema and schema[k].private)}


def describe(schema: Schema) -> dict[str, Any]:
    return {name: f.describe() for name, f in schema.items()}


def _kind_name(kind: type) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}[kind]


def _list(values: Any) -> str:
    return ", ".join(str(v) for v in values)
