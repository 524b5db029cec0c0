"""Tool contracts from what a server declares: the starting point an admin then edits.

Pure functions over plain values (no ORM): the discovered JSON schema becomes per-argument constraints, and the
tool's MCP annotations suggest a risk. Annotations are hints from the server, not trusted: the admin decides.
"""

from __future__ import annotations

from typing import Any

JSON_TYPES = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "array": "list",
    "object": "dict",
}


def schema_problem(input_schema: Any) -> str | None:
    """Why a discovered input schema cannot be offered to a model, or None. It must be a valid JSON schema
    describing an object (MCP requires it; a model provider such as Bedrock refuses anything else)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    if not isinstance(input_schema, dict):
        return "the input schema is not a JSON object"
    if input_schema.get("type", "object") != "object":
        return f"the input schema's type is {input_schema.get('type')!r}, not 'object'"
    try:
        Draft202012Validator.check_schema(input_schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(root)"
        return f"the input schema is not valid JSON schema at {where}: {exc.message}"
    return None


def argument_constraints(input_schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per-argument constraints read off a JSON schema (type, required, allowed, min/max, max length, pattern)."""
    properties = input_schema.get("properties") if isinstance(input_schema, dict) else None
    if not isinstance(properties, dict):
        return {}
    required = set(input_schema.get("required") or [])
    constraints: dict[str, dict[str, Any]] = {}
    for name, prop in properties.items():
        if not isinstance(prop, dict):
            continue
        spec: dict[str, Any] = {"required": name in required}
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
        constraints[str(name)] = spec
    return constraints


def suggested_risk(annotations: dict[str, Any]) -> str:
    """``read`` only when the server says the tool only reads (``readOnlyHint``) and does not say it is
    destructive; otherwise ``write``, as MCP's own defaults assume (a tool may modify its environment)."""
    if not isinstance(annotations, dict) or annotations.get("destructiveHint") is True:
        return "write"
    return "read" if annotations.get("readOnlyHint") is True else "write"


def contract_defaults(input_schema: dict[str, Any], annotations: dict[str, Any]) -> dict[str, Any]:
    return {"args": argument_constraints(input_schema), "risk": suggested_risk(annotations)}
