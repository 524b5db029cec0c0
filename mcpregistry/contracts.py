"""Tool contracts from what a server declares: the starting point an admin then edits.

Pure functions over plain values (no ORM): the discovered JSON schema becomes per-argument constraints, and the
tool's MCP annotations suggest a risk. Annotations are hints from the server, not trusted: the admin decides.
"""

from __future__ import annotations

import difflib
import json
import math
import random
import re
import types
import unicodedata
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard, Union, get_args, get_origin
from urllib.parse import urlparse

from django.utils.translation import gettext as _
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic import ValidationError as PydanticValidationError
from pydantic_core import PydanticSerializationError, to_json

from agent_platform.text import regex_error_text
from mcpregistry.binding_policy import url_problem

JSON_TYPES = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "array": "list",
    "object": "dict",
}
# Regex syntax JSON Schema's (ECMA 262) patterns do not have: a provider may refuse a schema that carries it.
PYTHON_ONLY_REGEX = re.compile(r"\(\?P[<=]|\\[AZ]|\(\?#|\(\?[aiLmsux]+\)")
# The contract's type names as JSON Schema's.
JSON_SCHEMA_TYPES = {ours: theirs for theirs, ours in JSON_TYPES.items()}
# The bounds the gate checks on an argument of each type (``check_args``): a range is a number's, a length a text's
# or a list's, a pattern a text's. Another bound on it would be shown to the model and never checked. An argument
# with no type takes them all (its value's kind decides which one applies).
ARGUMENT_BOUNDS: dict[str, frozenset[str]] = {
    "int": frozenset({"min", "max"}),
    "float": frozenset({"min", "max"}),
    "str": frozenset({"min_length", "max_length", "pattern"}),
    "list": frozenset({"min_length", "max_length"}),
    "bool": frozenset(),
    "dict": frozenset(),
}
_BOUNDS = ("min", "max", "min_length", "max_length", "pattern")


def misplaced_bounds(spec: dict[str, Any]) -> list[str]:
    """The bounds ``spec`` (an argument's constraints) sets that the gate never checks on an argument of its type
    (``min`` on a text, ``pattern`` on a number), in ``_BOUNDS``' order."""
    fitting = ARGUMENT_BOUNDS.get(spec.get("type") or "")
    if fitting is None:
        return []
    return [bound for bound in _BOUNDS if spec.get(bound) not in (None, "") and bound not in fitting]


# How deeply a tool's input schema may nest (objects and lists, the root counting one): checking a schema nested
# much deeper (a chain of ``anyOf``, some 80 levels) exhausts Python's recursion in ``jsonschema``, below what the
# pool parses. A tool's arguments need a few levels; this leaves room for many.
SCHEMA_MAX_DEPTH = 64
# Keywords a model provider refuses at the root of a tool's input schema: Anthropic's models (on Bedrock too)
# answer "input_schema does not support oneOf, allOf, or anyOf at the top level" and fail the whole request. They
# are left off what a model is offered, their branches' arguments offered beside the root's (``_object_root``); the
# server still checks the calls against them.
ROOT_COMBINATORS = ("anyOf", "oneOf", "allOf")


def schema_problem(input_schema: Any) -> str | None:
    """Why a discovered input schema cannot be offered to a model, or None (in the active language). It must be a
    valid JSON schema describing an object (MCP requires it; a model provider such as Bedrock refuses anything
    else), nested at most ``SCHEMA_MAX_DEPTH`` levels.
    A missing root ``type`` is an object's (``schema_with_contract`` writes it in). Never raises."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    if not isinstance(input_schema, dict):
        return _("the input schema is not a JSON object")
    if input_schema.get("type", "object") != "object":
        return _("the input schema's type is %(type)s, not 'object'") % {"type": repr(input_schema.get("type"))}
    if json_depth(input_schema) > SCHEMA_MAX_DEPTH:
        return _too_deep()
    try:
        Draft202012Validator.check_schema(input_schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(root)"
        return _("the input schema is not valid JSON schema at %(where)s: %(error)s") % {
            "where": where,
            "error": exc.message,
        }
    except RecursionError:  # under the bound, but called from deep in a stack already
        return _too_deep()
    return None


def _too_deep() -> str:
    return _("the input schema is nested more than %(levels)s levels deep") % {"levels": SCHEMA_MAX_DEPTH}


def json_depth(value: Any) -> int:
    """How many objects and lists ``value`` nests (a scalar 0, ``{}`` 1, ``{"a": []}`` 2). Walked without
    recursion: the value may be nested deeper than Python's recursion allows."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        pending.extend((child, depth + 1) for child in children)
    return deepest


def argument_constraints(input_schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per-argument constraints read off a JSON schema (type, required, allowed, min/max, min and max length,
    pattern): ``minLength`` (``minItems`` for a list) is ``min_length``, ``maxLength`` ``max_length``. An exclusive
    bound (``exclusiveMinimum``, Pydantic's ``Field(gt=0)``), which the contract has no key for, is read as the
    inclusive ``min``/``max`` that lets no more through (``_exclusive_bounds``). Left out, the tool itself refused
    such a value after a person had approved the call."""
    properties = input_schema.get("properties") if isinstance(input_schema, dict) else None
    if not isinstance(properties, dict):
        return {}
    required = set(input_schema.get("required") or [])
    constraints: dict[str, dict[str, Any]] = {}
    for name, prop in properties.items():
        if not isinstance(prop, dict):
            continue
        spec: dict[str, Any] = {"required": name in required}
        prop = optional_branch(prop)
        json_type = prop.get("type")
        if isinstance(json_type, list):  # ["string", "null"]: the non-null one
            json_type = next((t for t in json_type if t != "null"), None)
        if isinstance(json_type, str) and json_type in JSON_TYPES:
            spec["type"] = JSON_TYPES[json_type]
        if isinstance(prop.get("enum"), list):
            spec["allowed"] = prop["enum"]
        for source, target in (
            ("minimum", "min"),
            ("maximum", "max"),
            ("maxLength", "max_length"),
            ("pattern", "pattern"),
        ):
            if prop.get(source) is not None:
                spec[target] = prop[source]
        _exclusive_bounds(spec, prop)
        # At least 0 characters or items is no bound: not proposed.
        shortest = prop.get("minItems" if spec.get("type") == "list" else "minLength")
        if shortest is not None and shortest != 0:
            spec["min_length"] = shortest
        constraints[str(name)] = _checkable(spec)
    return constraints


def _number(value: Any) -> TypeGuard[float]:
    """Whether ``value`` is a finite JSON number (not true or false)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _exclusive_bounds(spec: dict[str, Any], prop: dict[str, Any]) -> None:
    """Write ``prop``'s exclusive bounds into ``spec`` as the inclusive ``min``/``max`` that let the same values
    through: for an integer the next whole number inside (``exclusiveMinimum: 0`` is ``min: 1``), for any other
    number the next float inside (every float above 0 is at least ``5e-324``). The stricter of an exclusive and an
    inclusive bound wins; draft 4's boolean form (``"minimum": 0, "exclusiveMinimum": true``) makes its
    ``minimum`` the exclusive one."""
    whole = spec.get("type") == "int"
    for exclusive, inclusive, target, inward in (
        ("exclusiveMinimum", "minimum", "min", math.inf),
        ("exclusiveMaximum", "maximum", "max", -math.inf),
    ):
        bound = prop.get(exclusive)
        if bound is True and _number(prop.get(inclusive)):
            bound = prop[inclusive]
            spec.pop(target, None)  # exclusive, not inclusive
        if not _number(bound):
            continue
        if whole:
            inside: float = math.floor(bound) + 1 if inward > 0 else math.ceil(bound) - 1
        else:
            inside = math.nextafter(bound, inward)
        current = spec.get(target)
        if not _number(current) or (inside > current if inward > 0 else inside < current):
            spec[target] = inside


def optional_branch(prop: dict[str, Any]) -> dict[str, Any]:
    """An optional argument as Pydantic writes it (``Optional[int]``: ``{"anyOf": [{"type": "integer",
    "minimum": 1}, {"type": "null"}]}``): its one non-null branch, with the property's own keys (description,
    default) beside it. Any other union is left as it is: no single type or range holds for it."""
    for key in ("anyOf", "oneOf"):
        branches = prop.get(key)
        if "type" in prop or not isinstance(branches, list):
            continue
        real = [b for b in branches if isinstance(b, dict) and b.get("type") != "null"]
        if len(real) == 1 and len(real) < len(branches):
            return {**{k: v for k, v in prop.items() if k != key}, **real[0]}
    return prop


def schema_with_contract(schema: Any, constraints: Any, *, idempotency_arg: str = "") -> dict[str, Any]:
    """The tool's input schema as the model is shown it: the discovered schema with the contract's argument
    constraints written in as JSON Schema (``allowed`` → ``enum``, ``min``/``max`` → ``minimum``/``maximum``,
    ``min_length``/``max_length`` → ``minLength``/``maxLength``, or ``minItems``/``maxItems`` for a list,
    ``pattern``, ``required``), so that the model meets the limits an admin set before the gate refuses a call for
    them. The inverse of ``argument_constraints``; the discovered schema is not changed. Its root is always an
    object's (``_object_root``), whatever the server listed.

    ``idempotency_arg`` (:func:`gate_filled_argument`): the argument the gate writes a write call's key into is
    not offered at all, neither as a property nor as required (the server's schema may require it): a model
    offered it had to invent a key, which the gate overwrote, or was refused for leaving it out."""
    merged: dict[str, Any] = dict(schema) if isinstance(schema, dict) else {}
    if not isinstance(constraints, dict) or not constraints:
        return _without_argument(_object_root(merged), idempotency_arg)
    properties = dict(merged.get("properties") or {}) if isinstance(merged.get("properties"), dict) else {}
    required = [str(n) for n in merged.get("required") or []] if isinstance(merged.get("required"), list) else []
    for name, spec in constraints.items():
        if not isinstance(spec, dict):
            continue
        prop = dict(properties.get(name) or {}) if isinstance(properties.get(name), dict) else {}
        if not {"type", "anyOf", "oneOf"} & set(prop) and spec.get("type") in JSON_SCHEMA_TYPES:
            prop["type"] = JSON_SCHEMA_TYPES[spec["type"]]
        if isinstance(spec.get("allowed"), list):
            prop["enum"] = list(spec["allowed"])
        # A bound stored before such specs were refused (``min`` on a text) is not checked: nor shown.
        unchecked = misplaced_bounds(spec)
        if spec.get("min") is not None and "min" not in unchecked:
            prop["minimum"] = spec["min"]
        if spec.get("max") is not None and "max" not in unchecked:
            prop["maximum"] = spec["max"]
        listed = prop.get("type") == "array" or spec.get("type") == "list"
        if spec.get("min_length") is not None and "min_length" not in unchecked:
            prop["minItems" if listed else "minLength"] = spec["min_length"]
        if spec.get("max_length") is not None and "max_length" not in unchecked:
            prop["maxItems" if listed else "maxLength"] = spec["max_length"]
        if spec.get("pattern") and "pattern" not in unchecked and not PYTHON_ONLY_REGEX.search(str(spec["pattern"])):
            prop["pattern"] = spec["pattern"]  # one only Python's re reads is checked by the gate, not shown
        properties[name] = prop
        if spec.get("required") and name not in required:
            required.append(name)
    merged["properties"] = properties
    if required:
        merged["required"] = required
    return _without_argument(_object_root(merged), idempotency_arg)


def _without_argument(schema: dict[str, Any], name: str) -> dict[str, Any]:
    """``schema`` (an object's, ``_object_root``'s) without the argument ``name`` in its properties or its
    ``required``; as it is where ``name`` is empty."""
    if not name:
        return schema
    trimmed = {**schema, "properties": {key: spec for key, spec in schema["properties"].items() if key != name}}
    required = schema.get("required")
    if isinstance(required, list):
        kept = [key for key in required if key != name]
        if kept:
            trimmed["required"] = kept
        else:
            del trimmed["required"]
    return trimmed


def gate_filled_argument(contract: Any) -> str:
    """The argument the gate writes itself into every send of a call to the tool: a write's idempotency key
    (``<run id>:<call id>``), never one the model or a rule gives. Empty for a read (the gate adds no key to one)
    and for a contract that names none. What callers pass as ``idempotency_arg`` to :func:`check_args` and
    :func:`schema_with_contract`."""
    if getattr(contract, "risk", "") != "write":
        return ""
    return str(getattr(contract, "idempotency_arg", "") or "")


def _object_root(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with the root every provider takes: ``"type": "object"`` and ``properties``. An argument-less
    tool may list ``{}`` (``schema_problem`` reads a missing type as an object's), which Bedrock refuses
    ("inputSchema.json.type must be one of the following: object"), failing every run offered the tool. A root
    ``anyOf``/``oneOf``/``allOf`` ("an id or a name") is left off, Anthropic's models refusing the whole request
    for it; the arguments its branches name are offered beside the root's, none required (the root's own win where
    both name one): a tool whose arguments were named only there kept them. The server still checks the calls
    against its own schema."""
    rooted = {key: value for key, value in schema.items() if key not in ROOT_COMBINATORS}
    rooted["type"] = "object"
    properties = dict(rooted["properties"]) if isinstance(rooted.get("properties"), dict) else {}
    for combinator in ROOT_COMBINATORS:
        branches = schema.get(combinator)
        for branch in branches if isinstance(branches, list) else []:
            named = branch.get("properties") if isinstance(branch, dict) else None
            for name, spec in named.items() if isinstance(named, dict) else []:
                properties.setdefault(name, spec)
    rooted["properties"] = properties
    return rooted


def _checkable(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` without the bounds a server's schema gave that the gate cannot check (a pattern Python's ``re``
    does not read, a length below 0, a range no value fits, a bound that is no number, one its type does not take:
    JSON Schema lets a ``minimum`` sit on a string): proposed, they would refuse every call or fail it, or fail the
    contract's own check; the admin sees the schema beside the contract and can write them again."""
    kept = {key: value for key, value in spec.items() if key not in misplaced_bounds(spec)}
    for bound in ("min", "max"):
        if bound in kept and (isinstance(kept[bound], bool) or not isinstance(kept[bound], int | float)):
            del kept[bound]
    if "min" in kept and "max" in kept and kept["min"] > kept["max"]:
        del kept["min"], kept["max"]
    for bound in ("min_length", "max_length"):
        length = kept.get(bound)
        if bound in kept and (isinstance(length, bool) or not isinstance(length, int) or length < 0):
            del kept[bound]
    if "min_length" in kept and "max_length" in kept and kept["min_length"] > kept["max_length"]:
        del kept["min_length"], kept["max_length"]
    if "pattern" in kept:
        try:
            re.compile(kept["pattern"])
        except (re.error, TypeError, OverflowError, RecursionError):  # a repeat count too large, groups too deep
            del kept["pattern"]
    return kept


def annotation_risk_hint(annotations: dict[str, Any]) -> str:
    """What the server's MCP annotations claim: ``read`` when it says the tool only reads (``readOnlyHint``) and
    is not destructive, else ``write``. A hint shown to the admin, never trusted: a hostile server can claim
    anything."""
    if not isinstance(annotations, dict) or annotations.get("destructiveHint") is True:
        return "write"
    return "read" if annotations.get("readOnlyHint") is True else "write"


def contract_defaults(input_schema: dict[str, Any], annotations: dict[str, Any]) -> dict[str, Any]:
    """A discovered tool's first contract: its arguments from the schema, and risk ``write`` (a person approves
    each call) until an admin marks it ``read`` — whatever the server's annotations say."""
    return {"args": argument_constraints(input_schema), "risk": "write"}


# ---- checking calls against a contract (seed 004) -------------------------------------------------------------

DEFAULT_RETRY: dict[str, Any] = {
    "max_attempts": 3,
    "on": ["timeout", "rate_limit", "transport"],
    # Seed 001: a rate limit waits 2 s, then 4 s (``2 ** attempt``).
    "backoff_base_s": 2.0,
    "backoff_cap_s": 8.0,
    "honor_retry_after": True,
}
# Reasons a retry can fix. Anything else (a bad argument, a wrong shape, an empty result) fails at once: asking
# again gets the same answer and only burns the budget.
RETRYABLE = frozenset({"timeout", "rate_limit", "transport"})


# ---- the shapes of a contract's JSON fields (validated at the service boundary and by the model) ----------------

JsonType = Literal["str", "int", "float", "bool", "list", "dict"]
RetryReason = Literal["timeout", "rate_limit", "transport"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _range_fits(spec: ArgSpec | FieldSpec) -> None:
    """``min`` and ``max``: a range no value fits in would refuse every call."""
    if spec.min is not None and spec.max is not None and spec.min > spec.max:
        raise ValueError(
            _("min (%(min)s) is greater than max (%(max)s): no value fits")
            % {"min": f"{spec.min:g}", "max": f"{spec.max:g}"}
        )


class ArgSpec(_Strict):
    type: JsonType | None = None
    required: bool = False
    allowed: list[Any] | None = None
    # Finite: NaN and the infinities (``1e400``) are no limit, and no JSON column stores them.
    min: float | None = Field(default=None, allow_inf_nan=False)
    max: float | None = Field(default=None, allow_inf_nan=False)
    max_length: int | None = Field(default=None, ge=0)
    pattern: str | None = None
    # At least this many characters of a text, items of a list (after ``pattern``: the keys an admin is told are
    # valid keep the order they had).
    min_length: int | None = Field(default=None, ge=0)
    # A URL argument's hosts: exact names or addresses, ``host:port``, ``*.example.com`` (any subdomain).
    allowed_hosts: list[str] | None = None

    @field_validator("pattern")
    @classmethod
    def _a_regular_expression(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except (re.error, OverflowError, RecursionError) as exc:  # a repeat count too large, groups too deep
                raise ValueError(
                    _("not a valid regular expression: %(error)s") % {"error": regex_error_text(exc)}
                ) from exc
        return value

    @model_validator(mode="after")
    def _a_value_fits(self) -> ArgSpec:
        _range_fits(self)
        if self.min_length is not None and self.max_length is not None and self.min_length > self.max_length:
            raise ValueError(
                _("min_length (%(min)s) is greater than max_length (%(max)s): no value fits")
                % {"min": self.min_length, "max": self.max_length}
            )
        misplaced = misplaced_bounds({bound: getattr(self, bound) for bound in _BOUNDS} | {"type": self.type})
        if misplaced:
            # The gate checks a range on numbers only, a length and a pattern on texts (a length on lists too):
            # kept, such a bound would be shown to the model as a limit and never held.
            raise ValueError(
                _(
                    "%(bounds)s cannot limit an argument of type %(type)s: the gate would never check it, yet the "
                    "model would be shown it. Remove it, or change the type."
                )
                % {"bounds": ", ".join(misplaced), "type": self.type}
            )
        # An allowed value of another type than the argument's (``x`` for an int) could never be matched.
        wrong = [v for v in self.allowed or [] if v is not None and self.type and not _type_ok(self.type, v)]
        if wrong:
            raise ValueError(
                _("allowed value %(value)s is not of the argument's type (%(type)s), so no call could match it")
                % {"value": json.dumps(wrong[0], ensure_ascii=False), "type": self.type}
            )
        return self


class FieldSpec(_Strict):
    type: JsonType | None = None
    non_empty: bool = False
    max_items: int | None = Field(default=None, ge=0)
    min: float | None = Field(default=None, allow_inf_nan=False)
    max: float | None = Field(default=None, allow_inf_nan=False)

    @model_validator(mode="after")
    def _a_value_fits(self) -> FieldSpec:
        _range_fits(self)
        return self


class ReturnsSpec(_Strict):
    type: JsonType | None = None
    required: list[str] = Field(default_factory=list)
    non_empty: bool = False
    max_items: int | None = Field(default=None, ge=0)
    max_chars: int | None = Field(default=None, ge=0)
    fields: dict[str, FieldSpec] = Field(default_factory=dict)


class RetrySpec(_Strict):
    """A contract's retry policy. Its defaults are :data:`DEFAULT_RETRY`'s (defined once, read by the gate)."""

    max_attempts: int = Field(default=DEFAULT_RETRY["max_attempts"], ge=1, le=10)
    on: list[RetryReason] = Field(default_factory=lambda: list(DEFAULT_RETRY["on"]))
    backoff_base_s: float = Field(default=DEFAULT_RETRY["backoff_base_s"], ge=0, le=60)
    backoff_cap_s: float = Field(default=DEFAULT_RETRY["backoff_cap_s"], ge=0, le=600)
    honor_retry_after: bool = DEFAULT_RETRY["honor_retry_after"]

    @model_validator(mode="after")
    def _base_within_cap(self) -> RetrySpec:
        """A base above the cap would be accepted and never used (the cap wins from the first wait on): refused,
        naming both, so that the admin writes the wait they mean."""
        if self.backoff_base_s > self.backoff_cap_s:
            raise ValueError(
                _(
                    "backoff_base_s (%(base)s s) is greater than backoff_cap_s (%(cap)s s): every wait would be the "
                    "cap; lower the base or raise the cap"
                )
                % {"base": f"{self.backoff_base_s:g}", "cap": f"{self.backoff_cap_s:g}"}
            )
        return self


def _unwrap_optional(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def spec_keys(model: type[BaseModel], path: Sequence[str | int] = ()) -> list[str] | None:
    """The keys a JSON object at ``path`` inside ``model``'s shape may hold (through nested models, dicts and
    lists), or None where no object with fixed keys is expected there."""
    current: Any = model
    for part in path:
        current = _unwrap_optional(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            found = current.model_fields.get(str(part))
            if found is None:
                return None
            current = found.annotation
        elif get_origin(current) in (dict, list):
            current = get_args(current)[-1]
        else:
            return None
    current = _unwrap_optional(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return None


def spec_problems(exc: PydanticValidationError, model: type[BaseModel], *, prefix: str = "") -> list[str]:
    """Pydantic's errors as an admin reads them: each names where (``region.max_len``) and, for a key the shape
    does not have, the keys it does have (with the closest one suggested); for a value outside a closed set,
    the values allowed (pydantic's own message lists them)."""
    problems: list[str] = []
    for error in exc.errors():
        loc = list(error["loc"])
        where = ".".join([prefix, *map(str, loc)] if prefix else map(str, loc)) or "(root)"
        problems.append(f"{where}: {spec_message(error, model)}")
    return problems


def spec_message(error: Any, model: type[BaseModel]) -> str:
    """One error of validating ``model`` as ``pydantic_message`` words it; a key ``model``'s shape does not have
    is named with the keys it does have (the closest one suggested), where pydantic wrote only, in English,
    "Extra inputs are not permitted"."""
    loc = list(error.get("loc", ()))
    if error.get("type") == "extra_forbidden" and loc:
        return unknown_key_problem(str(loc[-1]), spec_keys(model, loc[:-1]) or [])
    return pydantic_message(error)


def unknown_key_problem(key: str, keys: Sequence[str]) -> str:
    """A key that is not one of ``keys``, with the closest one suggested and all of them named."""
    close = difflib.get_close_matches(key, keys, n=1)
    hint = _(" (did you mean '%(key)s'?)") % {"key": close[0]} if close else ""
    return _("'%(key)s' is not a valid key%(hint)s; the valid keys are: %(keys)s") % {
        "key": key,
        "hint": hint,
        "keys": ", ".join(keys),
    }


def pydantic_message(error: Any) -> str:
    """One pydantic error's message in the reader's language for the kinds an admin meets in a form or an import
    (a number out of range, a wrong type, a value outside a closed set, a text or list too long or short, a text
    that does not match its pattern); pydantic's own English otherwise."""
    kind, context = error.get("type", ""), error.get("ctx") or {}
    messages: dict[str, Any] = {
        "greater_than_equal": lambda: _("must be at least %(limit)s") % {"limit": context.get("ge")},
        "greater_than": lambda: _("must be more than %(limit)s") % {"limit": context.get("gt")},
        "less_than_equal": lambda: _("must be at most %(limit)s") % {"limit": context.get("le")},
        "less_than": lambda: _("must be less than %(limit)s") % {"limit": context.get("lt")},
        "int_type": lambda: _("must be a whole number"),
        "int_parsing": lambda: _("must be a whole number"),
        "int_from_float": lambda: _("must be a whole number"),
        "float_type": lambda: _("must be a number"),
        "float_parsing": lambda: _("must be a number"),
        "finite_number": lambda: _("must be a finite number"),
        "bool_type": lambda: _("must be true or false"),
        "bool_parsing": lambda: _("must be true or false"),
        "string_type": lambda: _("must be text"),
        "list_type": lambda: _("must be a JSON list"),
        "dict_type": lambda: _("must be a JSON object"),
        "model_type": lambda: _("must be a JSON object"),
        "missing": lambda: _("is required"),
        "string_too_long": lambda: _("must be at most %(count)s characters") % {"count": context.get("max_length")},
        "string_too_short": lambda: _("must be at least %(count)s characters") % {"count": context.get("min_length")},
        "string_pattern_mismatch": lambda: _("must match %(pattern)s") % {"pattern": context.get("pattern")},
        "too_long": lambda: _("must hold at most %(count)s items") % {"count": context.get("max_length")},
        "too_short": lambda: _("must hold at least %(count)s items") % {"count": context.get("min_length")},
        "enum": lambda: (
            _("must be one of: %(values)s") % {"values": str(context.get("expected", "")).replace(" or ", ", ")}
        ),
        # pydantic writes the choices as "'read' or 'write'": listed with commas, in any language.
        "literal_error": lambda: (
            _("must be one of: %(values)s") % {"values": str(context.get("expected", "")).replace(" or ", ", ")}
        ),
        "value_error": lambda: str(context.get("error") or error.get("msg", "")),
    }
    found = messages.get(kind)
    return str(found()) if found is not None else str(error.get("msg", ""))


_PY_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "list": (list,),
    "dict": (dict,),
}


@dataclass(frozen=True)
class Verdict:
    """A failed check: ``reason`` is the code (``args:allowed:region``); ``detail`` says what and why."""

    reason: str
    detail: str
    allowed: list[Any] | None = None


def _type_ok(expected: str, value: Any) -> bool:
    if expected in {"int", "float"} and isinstance(value, bool):
        return False  # bool is a subclass of int: True is not a count
    return isinstance(value, _PY_TYPES.get(expected, (object,)))


def argument_names(constraints: dict[str, dict[str, Any]], input_schema: Any = None) -> frozenset[str] | None:
    """The names a call's arguments may have, or None when any name may be sent.

    The contract's argument names when it has any. Without them, the names the tool's input schema declares:
    none at all for a tool that takes no arguments (``"properties": {}``), so that an invented argument is
    refused there too. An absent ``additionalProperties`` counts as closed, as the contract a schema pre-fills
    does (MCP servers rarely write ``false``; FastMCP never). None when neither closes the list: no schema, a
    schema without ``properties``, or one whose ``additionalProperties`` or ``patternProperties`` lets other
    names through."""
    if constraints:
        return frozenset(constraints)
    if not isinstance(input_schema, dict) or not isinstance(input_schema.get("properties"), dict):
        return None
    if input_schema.get("additionalProperties", False) is not False or input_schema.get("patternProperties"):
        return None
    return frozenset(str(name) for name in input_schema["properties"])


# An argument's name as a reason code may carry it: a JSON Schema property name as tools write them.
_ARGUMENT_NAME = re.compile(r"[^\W\d][\w.-]{0,63}")  # any language's letters (지역), as names are written


def contract_out_of_date(contract_args: Any, input_schema: Any) -> bool:
    """Whether a published version's frozen contract arguments no longer fit the tool's input schema as discovered
    now: they name an argument the schema no longer declares (where its list is closed: ``argument_names``), or,
    where they list the arguments, the schema requires one they do not know. A contract without arguments takes
    the schema's, so it never contradicts it.

    Such a contract is not fitted to the new schema for the version (approving the schema's review fits the draft's
    contract only): the version stays as published, and its runs are not offered the tool, whose offer would
    merge both lists (``lookup(name)`` renamed ``lookup(full_name)`` was offered both as required, and the call
    with ``full_name`` refused as ``args:unknown``, "did you mean 'name'?"), until the agent is published again; the
    gate refuses its calls from any caller of that version (``tool:out_of_date``: a rule's, a flow node's)."""
    if not isinstance(contract_args, dict) or not contract_args:
        return False
    return _names_misfit(contract_args, input_schema)


def _names_misfit(names: Collection[Any], input_schema: Any, *, filled: str = "") -> bool:
    """Whether argument ``names`` do not fit ``input_schema``: one its closed list does not declare
    (``argument_names``), or none of one it requires (``filled``, the gate's own argument, aside)."""
    declared = argument_names({}, input_schema)
    if declared is not None and any(str(name) not in declared for name in names):
        return True
    required = input_schema.get("required") if isinstance(input_schema, dict) else None
    return isinstance(required, list) and any(str(n) not in names and str(n) != filled for n in required)


def frozen_out_of_date(frozen: Any, mcp_id: str, tool: Any) -> bool:
    """Whether the contract a published version froze for ``tool`` of the server ``mcp_id`` (``frozen``: its
    contracts by ``mcp_id/tool``, or None for a run of no version) no longer fits the arguments the tool lists now
    (``contract_out_of_date``): its runs' model is not offered the tool, its card does not list it."""
    contract = frozen.get(f"{mcp_id}/{tool.name}") if frozen is not None else None
    return contract is not None and contract_out_of_date(getattr(contract, "args", None), tool.input_schema)


def call_out_of_date(frozen: Any, mcp_id: str, tool: Any, args: Any, *, filled: str = "") -> bool:
    """Whether a call of ``tool`` with ``args`` by a published version whose frozen contract no longer fits the
    tool (``frozen_out_of_date``) sends what its server no longer takes: an argument its closed list no longer
    declares, or none of one it requires now (``filled``: the argument the gate writes itself). A call whose
    arguments still fit goes out as before (a rule sending only ``name`` where the server dropped an optional
    ``limit``)."""
    if not isinstance(args, dict) or not frozen_out_of_date(frozen, mcp_id, tool):
        return False
    return _names_misfit(args, tool.input_schema, filled=filled)


def unknown_argument_hint(name: str, known: Collection[str]) -> str:
    """What to say after "'name' is not an argument of this tool": the closest argument, the list, or that the
    tool takes none."""
    if not known:
        return _("; this tool takes no arguments: call it with {}")
    close = [k for k in known if k.replace("_", "") in name.replace("_", "") or name.startswith(k)]
    if close:
        return _("; did you mean '%(name)s'?") % {"name": close[0]}
    return _("; the arguments are: %(names)s") % {"names": ", ".join(sorted(known))}


def json_unwritable(args: Any) -> bool:
    """Whether ``args`` cannot be written as the JSON of an MCP request: text that is not valid Unicode (a lone
    surrogate, ``"\\ud83d"``, in a name or a value: no UTF-8 encoder writes it) or a value JSON has no form for.
    Written as the MCP SDK writes its requests (pydantic's encoder): such a request fails in the session before
    anything is sent."""
    try:
        to_json(args)
    except (PydanticSerializationError, ValueError, TypeError):
        return True
    return False


def check_args(
    constraints: dict[str, dict[str, Any]],
    args: Any,
    *,
    unknown: str = "refuse",
    input_schema: Any = None,
    idempotency_arg: str = "",
) -> tuple[dict[str, Any], Verdict | None]:
    """Check arguments before the call. Returns (the arguments to send, None) or (args, the first failure).

    Order: JSON object (one a request can carry: ``json_unwritable``), unknown names (those ``argument_names``
    does not list, given the tool's ``input_schema``), missing, then per argument type, allowed, range, length, pattern, and a
    URL's host (``allowed_hosts``: ``args:host:<arg>``, see ``url_host_problem``). A bool
    is not an int and a numeric string is not a number. With ``unknown="drop"`` unknown arguments are removed.

    ``idempotency_arg`` (:func:`gate_filled_argument`): the argument the gate writes the key into after these
    checks is neither required nor checked, and a value the caller gave it is dropped: the key is the gate's.
    """
    if not isinstance(args, dict) or not all(isinstance(name, str) for name in args):
        # An object's names are text in JSON; a caller's dict keyed 1 or None (a flow's, a code rule's) is none.
        return {}, Verdict("args:json", _("the arguments are not a JSON object"))
    if idempotency_arg:
        # A key a model made up would be overwritten by the gate's anyway: dropped before anything looks at it (an
        # approval shows the call without it, and the hash a person approves does not depend on it).
        args = {name: value for name, value in args.items() if name != idempotency_arg}
    if json_unwritable(args):
        # Never quoted: the text is what no encoder writes (the refusal goes back to the model and the audit).
        return {}, Verdict(
            "args:json",
            _("the arguments hold text that is not valid Unicode (an unpaired surrogate) or a value JSON cannot hold"),
        )
    names = argument_names(constraints, input_schema)
    known = set(names) if names is not None else set()
    extra = sorted(set(args) - known) if names is not None else []
    if extra and unknown == "refuse":
        hint = unknown_argument_hint(extra[0], known)
        # The name is the caller's (a model's): it joins the reason code only as a name (``args:unknown:regoin``),
        # never as free text, which would carry whatever the model wrote into the audit's reason column, span
        # attributes and metric labels.
        named = f":{extra[0]}" if _ARGUMENT_NAME.fullmatch(extra[0]) else ""
        return args, Verdict(
            f"args:unknown{named}",
            _("'%(name)s' is not an argument of this tool%(hint)s") % {"name": extra[0], "hint": hint},
        )
    clean = {k: v for k, v in args.items() if k in known} if (extra and unknown == "drop") else dict(args)
    for name, spec in constraints.items():
        if name == idempotency_arg:
            continue  # the gate's to fill in
        if name not in clean:
            if spec.get("required"):
                return clean, Verdict(
                    f"args:missing:{name}", _("the required argument '%(name)s' is missing") % {"name": name}
                )
            continue
        value = clean[name]
        if value is None and not spec.get("required"):
            # An optional argument sent as null is one not given where the tool's default is null too (Pydantic's
            # ``Optional[int] = None``): not sent. Where its default is something else, null may mean something
            # of its own ("no limit", "clear the field"): sent as it is, for the tool to judge.
            if _schema_default(input_schema, name) is None:
                del clean[name]
            continue
        expected = spec.get("type")
        if expected and not _type_ok(expected, value):
            return clean, Verdict(
                f"args:type:{name}",
                _("'%(name)s' must be of type %(expected)s, got %(kind)s %(value)s")
                % {"name": name, "expected": expected, "kind": type(value).__name__, "value": repr(value)},
            )
        allowed = spec.get("allowed")
        if allowed is not None and not _is_one_of(value, allowed):
            return clean, Verdict(
                f"args:allowed:{name}",
                _("'%(name)s' must be one of %(allowed)s; got %(value)s")
                % {"name": name, "allowed": ", ".join(map(str, allowed)), "value": repr(value)},
                allowed,
            )
        # A range is a number's (on an argument typed otherwise it is not read): true is not 1 (seed 004: bool is a
        # subclass of int) and "20" is not 20.
        low, high = (spec.get("min"), spec.get("max")) if expected in (None, "", "int", "float") else (None, None)
        ranged = low is not None or high is not None
        if ranged and (isinstance(value, bool) or not isinstance(value, int | float)):
            return clean, Verdict(
                f"args:type:{name}",
                _("'%(name)s' must be a number, got %(kind)s %(value)s")
                % {"name": name, "kind": type(value).__name__, "value": repr(value)},
            )
        if isinstance(value, float) and not math.isfinite(value) and (ranged or expected in ("int", "float")):
            # NaN is inside no range (every comparison with it is false) and no JSON number is NaN or infinite: a
            # model's call parsed by Python's json.loads may carry one.
            return clean, Verdict(
                f"args:type:{name}",
                _("'%(name)s' must be a finite number, got %(value)s") % {"name": name, "value": repr(value)},
            )
        if (low is not None and value < low) or (high is not None and value > high):
            limits = {"name": name, "low": low, "high": high, "value": repr(value)}
            if low is not None and high is not None:
                detail = _("'%(name)s' must be between %(low)s and %(high)s; got %(value)s") % limits
            elif low is not None:
                detail = _("'%(name)s' must be at least %(low)s; got %(value)s") % limits
            else:
                detail = _("'%(name)s' must be at most %(high)s; got %(value)s") % limits
            return clean, Verdict(f"args:range:{name}", detail)
        if isinstance(value, str | list) and spec.get("min_length") is not None and len(value) < spec["min_length"]:
            return clean, Verdict(
                f"args:range:{name}",
                _("'%(name)s' is shorter than %(limit)s (%(length)s)")
                % {"name": name, "limit": spec["min_length"], "length": len(value)},
            )
        if isinstance(value, str | list) and spec.get("max_length") is not None and len(value) > spec["max_length"]:
            return clean, Verdict(
                f"args:range:{name}",
                _("'%(name)s' is longer than %(limit)s (%(length)s)")
                % {"name": name, "limit": spec["max_length"], "length": len(value)},
            )
        if isinstance(value, str) and spec.get("pattern") and not _matches(spec["pattern"], value):
            return clean, Verdict(
                f"args:pattern:{name}",
                _("'%(name)s' must match %(pattern)s; got %(value)s")
                % {"name": name, "pattern": spec["pattern"], "value": repr(value)},
            )
        if spec.get("allowed_hosts") is not None:
            problem = url_host_problem(value, spec["allowed_hosts"])
            if problem:
                return clean, Verdict(
                    f"args:host:{name}",
                    _("'%(name)s' %(problem)s") % {"name": name, "problem": problem},
                    list(spec["allowed_hosts"]),
                )
    return clean, None


def _host_matches(host: str, port: int | None, entry: str) -> bool:
    entry = entry.strip().lower().rstrip(".")
    if entry.startswith("*."):
        return host.endswith(entry[1:]) and host != entry[2:]
    return entry in {host, f"{host}:{port}"}


def url_host_problem(value: Any, allowed_hosts: list[str]) -> str | None:
    """Why ``value`` is not an http(s) URL on one of ``allowed_hosts``, or None.

    A host matches an entry exactly (``example.com``, ``127.0.0.1``, ``host:port``) or by ``*.`` suffix. A
    loopback, private, link-local or metadata address (in any spelling, ``binding_policy.url_problem``) passes
    only when an entry names it exactly: a wildcard never lets one through. No DNS is resolved here, and what
    the server does after (a redirect it follows) is beyond the gate's sight."""
    if not isinstance(value, str):
        return _("must be a URL")
    try:
        parsed = urlparse(value.strip())
        port = parsed.port
    except ValueError:
        return _("is not a usable URL: %(value)s") % {"value": repr(value)}
    if parsed.scheme not in {"http", "https"} or not parsed.hostname or parsed.username or parsed.password:
        return _("must be an http:// or https:// URL without credentials; got %(value)s") % {"value": repr(value)}
    host = parsed.hostname.lower().rstrip(".")
    if not any(_host_matches(host, port, entry) for entry in allowed_hosts):
        return _("may only name the hosts %(hosts)s; got '%(host)s'") % {
            "hosts": ", ".join(allowed_hosts) or "-",
            "host": host,
        }
    exact = [e for e in allowed_hosts if not e.strip().startswith("*.")]
    if url_problem(value.strip(), exact):
        return _("names '%(host)s', a private, loopback or metadata address") % {"host": host}
    return None


def _schema_default(input_schema: Any, name: str) -> Any:
    """The default the tool's input schema gives the argument ``name`` (None where it gives none)."""
    properties = input_schema.get("properties") if isinstance(input_schema, dict) else None
    prop = properties.get(name) if isinstance(properties, dict) else None
    return prop.get("default") if isinstance(prop, dict) else None


def composed(value: Any) -> Any:
    """``value`` with its texts composed (Unicode NFC), in lists and objects too (their keys as well): Korean typed
    on macOS comes decomposed (``서울`` as six jamo), looks the same and is the same word. The platform compares
    text composed on both sides (tags, rules, queries); what a tool is sent stays as the caller wrote it."""
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, list):
        return [composed(item) for item in value]
    if isinstance(value, dict):
        return {composed(key): composed(item) for key, item in value.items()}
    return value


def _is_one_of(value: Any, allowed: list[Any]) -> bool:
    """``value in allowed``, but true is not 1 and 1 is not true (``True in [0, 1]`` is true in Python), and texts
    compare composed (``composed``)."""
    value = composed(value)
    return any(
        (a is value) if isinstance(value, bool) or isinstance(a, bool) else composed(a) == value for a in allowed
    )


def _matches(pattern: str, value: str) -> bool:
    """Whether ``pattern`` finds a match in ``value``, both composed (``composed``): a pattern's ``서울`` matches
    the word typed decomposed. A pattern its composed form breaks (literal jamo in a class, which no composed
    value holds anyway) is used as written."""
    try:
        compiled = re.compile(composed(pattern))
    except re.error:
        compiled = re.compile(pattern)
    return compiled.search(composed(value)) is not None


def _not_finite(value: Any) -> bool:
    """Whether ``value`` is NaN or an infinity: a number no JSON column stores and no range holds."""
    return isinstance(value, float) and not math.isfinite(value)


def _keys_composed(value: dict[Any, Any]) -> dict[Any, Any]:
    """``value``'s keys by their composed form (``composed``), to the key as the tool wrote it."""
    return {composed(key): key for key in value}


def check_result(returns: dict[str, Any], value: Any) -> Verdict | None:
    """Check a result after the call: shape (type, required keys, field types), empty, too big, range. Keys are
    found composed (``composed``): a decomposed ``지역`` is the key ``지역``. Where a number is expected (a type
    ``int`` or ``float``, a range), NaN and the infinities are ``result:shape``: no JSON carries them, and the model
    and the API would read ``nan``."""
    if not returns:
        return None
    expected = returns.get("type")
    if expected and not _type_ok(expected, value):
        return Verdict(
            "result:shape",
            _("expected a %(expected)s result, got %(kind)s") % {"expected": expected, "kind": type(value).__name__},
        )
    if expected in ("int", "float") and _not_finite(value):
        return Verdict("result:shape", _("expected a finite number, got %(value)s") % {"value": repr(value)})
    keys = _keys_composed(value) if isinstance(value, dict) else {}
    required = returns.get("required") or []
    if required:
        if not isinstance(value, dict):
            return Verdict(
                "result:shape",
                _("expected an object with %(keys)s, got %(kind)s")
                % {"keys": ", ".join(required), "kind": type(value).__name__},
            )
        missing = [k for k in required if composed(k) not in keys]
        if missing:
            return Verdict(
                "result:shape",
                _("the result lacks %(missing)s (it has %(present)s)")
                % {"missing": ", ".join(missing), "present": ", ".join(map(str, value))},
            )
    if returns.get("non_empty") and value in (None, "", [], {}):
        return Verdict("result:empty", _("the tool returned nothing"))
    max_items = returns.get("max_items")
    if max_items is not None and isinstance(value, list | dict) and len(value) > max_items:
        return Verdict(
            "result:too_big", _("%(count)s items, more than %(limit)s") % {"count": len(value), "limit": max_items}
        )
    max_chars = returns.get("max_chars")
    if max_chars is not None:
        size = len(value) if isinstance(value, str) else len(json.dumps(value, ensure_ascii=False, default=str))
        if size > max_chars:
            return Verdict(
                "result:too_big", _("%(count)s characters, more than %(limit)s") % {"count": size, "limit": max_chars}
            )
    for key, spec in (returns.get("fields") or {}).items():
        if not isinstance(value, dict) or composed(key) not in keys:
            continue
        field_value = value[keys[composed(key)]]
        if spec.get("type") and not _type_ok(spec["type"], field_value):
            return Verdict(
                "result:shape",
                _("'%(key)s' should be a %(expected)s, got %(value)s")
                % {"key": key, "expected": spec["type"], "value": repr(field_value)},
            )
        if spec.get("type") in ("int", "float") and _not_finite(field_value):
            return Verdict(
                "result:shape",
                _("'%(key)s' should be a finite number, got %(value)s") % {"key": key, "value": repr(field_value)},
            )
        if spec.get("non_empty") and field_value in (None, "", [], {}):
            return Verdict("result:empty", _("'%(key)s' is empty") % {"key": key})
        if spec.get("max_items") is not None and isinstance(field_value, list) and len(field_value) > spec["max_items"]:
            return Verdict(
                "result:too_big",
                _("'%(key)s' has %(count)s items, more than %(limit)s")
                % {"key": key, "count": len(field_value), "limit": spec["max_items"]},
            )
        low, high = spec.get("min"), spec.get("max")
        if (low is not None or high is not None) and field_value is not None:
            # A range is a number's: "720" is not 720, true is not 1, and NaN is inside no range.
            if (
                isinstance(field_value, bool)
                or not isinstance(field_value, int | float)
                or not math.isfinite(field_value)
            ):
                return Verdict(
                    "result:shape",
                    _("'%(key)s' should be a finite number, got %(value)s") % {"key": key, "value": repr(field_value)},
                )
            if (low is not None and field_value < low) or (high is not None and field_value > high):
                return Verdict("result:range", _out_of_range(key, field_value, low, high))
    return None


def _out_of_range(key: str, value: float, low: float | None, high: float | None) -> str:
    """What is wrong with a result field outside its range, naming only the bounds the contract set."""
    limits = {"key": key, "value": value, "low": low, "high": high}
    if low is not None and high is not None:
        return _("'%(key)s' is %(value)s, outside [%(low)s, %(high)s]") % limits
    if low is not None:
        return _("'%(key)s' is %(value)s, below %(low)s") % limits
    return _("'%(key)s' is %(value)s, above %(high)s") % limits


BACKOFF_JITTER = 0.25  # the most a wait is lengthened by, as a share of it: clients refused together spread out


def backoff_delay(
    *, reason: str, attempt: int, retry: dict[str, Any], retry_after_s: float | None, rng: random.Random
) -> float:
    """Seconds to wait before attempt ``attempt + 1``. A timeout is retried at once (it may be transient and
    the wait already happened); a rate limit waits exponentially (``backoff_base_s`` doubled per attempt, at most
    ``backoff_cap_s``) and a jitter of up to a quarter of that on top, or the server's ``Retry-After`` when it
    gives one; a transport error waits a short jittered backoff. The jitter is added, never taken off: seed 001
    waits 2 s, then 4 s, because a server called again sooner refuses again (an "equal jitter" between half the
    wait and all of it waited 1.5 s, then 3 s, on average). No wait is longer than ``backoff_cap_s``, the longest
    the contract's summary shows: a wait at the cap gets no jitter, one near it only what fits below it (with the
    default 8 s cap, the third wait was up to 10 s)."""
    if reason == "timeout":
        return 0.0
    base = float(retry.get("backoff_base_s", DEFAULT_RETRY["backoff_base_s"]))
    cap = float(retry.get("backoff_cap_s", DEFAULT_RETRY["backoff_cap_s"]))
    if reason == "rate_limit" and retry_after_s is not None and retry.get("honor_retry_after", True):
        return min(max(retry_after_s, 0.0), cap)
    ceiling = min(cap, base * (2 ** (attempt - 1)))
    if reason == "transport":
        ceiling = min(ceiling, base)
    return rng.uniform(ceiling, min(cap, ceiling * (1 + BACKOFF_JITTER)))


_RETRY_AFTER = re.compile(r"retry[-_ ]after[\"':= ]+(\d+(?:\.\d+)?)", re.IGNORECASE)
# A 429 as a status (leading the text, or after HTTP/status/code/error), not any number 429 a message quotes.
# A status opening a text: after punctuation ("[429]", "(504)") but never a quote mark, and followed by none: a quoted
# number opening a text is a value the tool echoes ("'429' 자산을 찾을 수 없습니다": asset 429 was not found).
_QUOTE_PAIRS = ("''", '""', "``", "‘’", "“”", "«»", "「」", "『』")
_QUOTES = "".join(dict.fromkeys("".join(_QUOTE_PAIRS)))
# A quoted span: its mark opens after a non-word character or at the text's start, the matching mark closes it where
# no Latin letter or digit follows (a Korean particle may: "'X'를"), on one line, within 200 characters. So an
# apostrophe inside a word ("didn't", "the server's backend") neither opens a quote nor closes one, and a mark left
# open swallows nothing.
_QUOTED = re.compile(
    "|".join(
        rf"(?<!\w){re.escape(pair[0])}[^\r\n]{{0,200}}?{re.escape(pair[1])}(?![A-Za-z0-9])" for pair in _QUOTE_PAIRS
    )
)


def _blank_quoted(text: str, echoed: Collection[str]) -> str:
    """``text`` with the words of each quoted span that holds one of the caller's values (``echoed``) replaced by
    ``_`` (its marks stay). Spans of the tool's own are read as written: a JSON error body's values
    (``{"error": "upstream timed out"}``) and a message it quotes from upstream are its status."""

    def blank(found: re.Match[str]) -> str:
        quoted = found.group()
        words = unicodedata.normalize("NFC", quoted[1:-1]).casefold()
        return f"{quoted[0]}_{quoted[-1]}" if any(value in words for value in echoed) else quoted

    return _QUOTED.sub(blank, text)


def argument_texts(args: Any) -> list[str]:
    """The text values of a call's arguments (nested ones too), composed and case-folded: what a tool's error may
    echo back (``classify_tool_error``'s ``echoed``). Values of one character are left out: quoted, they say too
    little to be told from the tool's own words."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            text = unicodedata.normalize("NFC", value).strip().casefold()
            if len(text) > 1:
                found.append(text)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    walk(args)
    return found


def _without_echoed_words(text: str, echoed: Collection[str]) -> str:
    """The part of a tool's error text that is the tool's own: a quoted span holding a value the caller sent is
    the caller's words echoed (the demo server's "'<asset_id>' 자산을 찾을 수 없습니다"), and any user whose words
    reach an argument could otherwise write a status there ("X timed out", "status 429") and open the server's
    circuit for everyone. A text quoted whole is a tool's message written as a string
    ("\"429 Too Many Requests\""): its words are read, the echoes it quotes are not. Marks a caller's words carry
    themselves (an id with a quote in it) can still end a span early: the server should escape what it echoes."""
    if not echoed:
        return text
    stripped = text.strip()
    whole = _QUOTED.match(stripped)
    if whole is not None and whole.end() == len(stripped):
        return stripped[0] + _blank_quoted(stripped[1:-1], echoed) + stripped[-1]
    return _blank_quoted(text, echoed)


def _status(code: str) -> str:
    """``code`` as a status: opening the text unquoted, or after the word that names one, however it is written
    ("HTTP 429", "status code: 504", a JSON error's ``{"code": 429}``)."""
    return (
        rf"^[^\w{_QUOTES}]*(?:error\W*)?{code}\b(?![{_QUOTES}])"
        rf"|\b(?:HTTP(?:/[\d.]+)?|status(?:\s+code)?|code|error)\W{{0,3}}{code}\b"
    )


# Rate-limit words count where they say one was hit ("rate limit exceeded", "rate limited"), not where a text
# names them (a list of modes "none, timeout, rate_limit", a setting's name).
_RATE_LIMITED = re.compile(
    _status("429") + r"|\brate[ _-]?limit(?:ed\b|s?\W{0,3}(?:was\s+|has\s+been\s+|is\s+)?(?:exceeded|reached|hit)\b)"
    r"|too many requests",
    re.IGNORECASE,
)
# A timeout in English or Korean ("응답 시간 초과", "타임아웃: …", "백엔드 응답이 계속 지연됩니다", "did not respond in
# time"): Korean words join their particles ("시간초과로", "응답하지 않습니다"), so they are found inside a word.
_TIMED_OUT = re.compile(
    r"^\s*timeout\b|\btimed[ -]out\b|\bdeadline exceeded\b"
    r"|\b(?:did\s+not|didn't|failed\s+to)\s+respond\s+in\s+time\b|\bno\s+response\s+within\b"
    r"|\b(?:request|gateway)\s+time-?out\b"
    r"|시간\s?초과|타임\s?아웃|응답(?:이|은)?\s?(?:계속\s?)?지연|응답하지\s?않|응답이?\s?없|" + _status("504"),
    re.IGNORECASE,
)
# A text that opens with a rate limit (its status, or its words) is one, whatever it says after.
_OPENS_RATE_LIMITED = re.compile(
    rf"^[^\w{_QUOTES}]*(?:error\W*)?(?:429\b(?![{_QUOTES}])|rate[ _-]?limit|too many requests)", re.IGNORECASE
)


# Pydantic's kinds of error as the argument refusals ``check_args`` makes (``args:<family>:<argument>``): a local tool
# whose own schema refuses an argument the contract let through (``local_tools``) is refused as the gate refuses one.
_PYDANTIC_REFUSALS = {
    "missing": "args:missing",
    "extra_forbidden": "args:unknown",
    "greater_than": "args:range",
    "greater_than_equal": "args:range",
    "less_than": "args:range",
    "less_than_equal": "args:range",
    "string_too_short": "args:range",
    "string_too_long": "args:range",
    "too_short": "args:range",
    "too_long": "args:range",
    "string_pattern_mismatch": "args:pattern",
    "literal_error": "args:allowed",
    "enum": "args:allowed",
}


def argument_refusal(errors: Sequence[Any]) -> tuple[str, str]:
    """A local tool's arguments that its own schema refused (pydantic's ``ValidationError.errors()``) as the refusal
    ``check_args`` would have made: the reason code of the first (``args:range:amount``; a kind not named in
    ``_PYDANTIC_REFUSALS`` is a type's), and what is wrong with each argument, in the reader's language. The local
    runner hands the code to the gate beside its text (``ToolCallOutcome.refused``), never inside it: a server's
    error text is never read for one."""
    problems: list[str] = []
    reason = "args:type"
    for index, error in enumerate(errors):
        loc = [str(part) for part in error.get("loc", ())]
        if index == 0:
            reason = _PYDANTIC_REFUSALS.get(str(error.get("type", "")), "args:type")
            if loc and _ARGUMENT_NAME.fullmatch(loc[0]):
                reason = f"{reason}:{loc[0]}"
        problems.append(
            _("'%(name)s' %(problem)s") % {"name": ".".join(loc), "problem": pydantic_message(error)}
            if loc
            else pydantic_message(error)
        )
    return reason, "; ".join(problems)


def classify_tool_error(text: str, echoed: Collection[str] = ()) -> tuple[str, float | None]:
    """The reason of a tool's own error (``isError``): ``rate_limit`` (with a Retry-After, if stated),
    ``timeout`` (the tool's backend timed out: worth another try) or ``tool:error``, never an argument refusal
    (``args:*``), whatever the text says: only the platform's own local runner makes one (``argument_refusal``,
    ``ToolCallOutcome.refused``). A text that opens with a rate limit is one; another that mentions a timeout is a
    timeout, whatever else it quotes (a 429 in an argument it echoes): for a write, the reason that leaves its
    outcome unknown (``gate._attempts``). A quoted span holding one of the call's own values (``echoed``:
    ``argument_texts``) is never read for a status (``_without_echoed_words``): "'X timed out' 자산을 찾을 수
    없습니다" for the asset id "X timed out" is a tool error, while ``{"error": "upstream timed out"}`` is a timeout."""
    own = _without_echoed_words(text or "", echoed)
    if not _OPENS_RATE_LIMITED.search(own) and _TIMED_OUT.search(own):
        return "timeout", None
    if _RATE_LIMITED.search(own):
        found = _RETRY_AFTER.search(own)
        return "rate_limit", float(found.group(1)) if found else None
    return "tool:error", None
