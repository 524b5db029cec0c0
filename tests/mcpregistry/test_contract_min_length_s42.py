"""A contract argument's ``min_length`` (defect s42 minlength): a JSON schema's ``minLength`` (``minItems`` for a
list) was written into the pre-filled contract as a ``pattern`` (``^[\\s\\S]{2,}``), which the admin saw in the
editor as a strange regular expression and the model was told as "must match ^[\\s\\S]{2,}". It is now a key of its
own beside ``max_length``: read off a schema, shown to the model as ``minLength``/``minItems``, checked by the gate
(``args:range``), edited on the contract page (a minimum over the maximum refused) and put in words."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from mcpregistry.contract_words import argument_words
from mcpregistry.contracts import ArgSpec, argument_constraints, check_args, schema_with_contract
from mcpregistry.models import McpTool, ToolContract
from tests.mcpregistry.test_contract_editor import errors, lookup, post  # noqa: F401 (lookup: a fixture)

SCHEMA = {
    "type": "object",
    "properties": {
        "reason": {"type": "string", "minLength": 2, "maxLength": 40},
        "code": {"type": "string", "minLength": 3, "pattern": r"^\d+$"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "count": {"type": "integer", "minLength": 2},  # a length on a number: never checked, not proposed
        "note": {"type": "string", "minLength": 0},
    },
    "required": ["reason"],
}


def test_a_schemas_min_length_and_min_items_are_the_contracts_min_length() -> None:
    assert argument_constraints(SCHEMA) == {
        "reason": {"required": True, "type": "str", "min_length": 2, "max_length": 40},
        "code": {"required": False, "type": "str", "min_length": 3, "pattern": r"^\d+$"},
        "tags": {"required": False, "type": "list", "min_length": 1},
        "count": {"required": False, "type": "int"},
        "note": {"required": False, "type": "str"},
    }


def test_a_min_length_over_the_schemas_max_length_is_not_proposed() -> None:
    schema = {"properties": {"name": {"type": "string", "minLength": 5, "maxLength": 2}}}
    assert argument_constraints(schema) == {"name": {"required": False, "type": "str"}}


def test_the_model_is_shown_min_length_as_json_schema() -> None:
    shown = schema_with_contract(
        {"type": "object", "properties": {"reason": {"type": "string"}, "tags": {"type": "array"}}},
        {"reason": {"type": "str", "min_length": 2}, "tags": {"type": "list", "min_length": 1, "max_length": 3}},
    )
    assert shown["properties"]["reason"] == {"type": "string", "minLength": 2}
    assert shown["properties"]["tags"] == {"type": "array", "minItems": 1, "maxItems": 3}
    assert "pattern" not in shown["properties"]["reason"]


def test_the_gate_refuses_a_text_or_a_list_shorter_than_min_length_as_a_range() -> None:
    constraints = {"reason": {"type": "str", "min_length": 2}, "tags": {"type": "list", "min_length": 1}}
    _, short_text = check_args(constraints, {"reason": "x"})
    assert short_text is not None
    assert (short_text.reason, short_text.detail) == ("args:range:reason", "'reason' is shorter than 2 (1)")
    _, no_items = check_args(constraints, {"reason": "파손", "tags": []})
    assert no_items is not None
    assert (no_items.reason, no_items.detail) == ("args:range:tags", "'tags' is shorter than 1 (0)")
    assert check_args(constraints, {"reason": "파손", "tags": ["a"]}) == ({"reason": "파손", "tags": ["a"]}, None)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"type": "str", "min_length": 5, "max_length": 2}, "min_length (5) is greater than max_length (2)"),
        ({"type": "int", "min_length": 2}, "min_length cannot limit an argument of type int"),
        ({"type": "str", "min_length": -1}, "greater than or equal to 0"),
    ],
)
def test_a_min_length_no_value_fits_or_its_type_never_checks_is_refused(spec: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        ArgSpec.model_validate(spec)


def test_min_length_in_words() -> None:
    spec = {"type": "str", "required": True, "min_length": 2, "max_length": 40}
    assert argument_words("reason", spec) == "reason: text (str), required, at least 2 long, at most 40 long"


@pytest.mark.django_db
def test_the_editor_has_a_min_length_field_beside_max_length(admin_client, lookup: McpTool) -> None:  # noqa: F811
    page = admin_client.get(f"/admin/mcpregistry/mcptool/{lookup.pk}/change/").content.decode()
    assert page.index('name="contract-0-args__0__min_length"') < page.index('name="contract-0-args__0__max_length"')
    status, page = post(
        admin_client,
        lookup,
        **{"contract-0-args__0__min_length": "2", "contract-0-args__0__max_length": "20"},
    )
    assert status == 302, errors(page)
    assert ToolContract.objects.get(tool=lookup).args["name"] == {
        "type": "str",
        "required": True,
        "min_length": 2,
        "max_length": 20,
    }
    page = admin_client.get(f"/admin/mcpregistry/mcptool/{lookup.pk}/change/").content.decode()
    assert 'name="contract-0-args__0__min_length" value="2"' in page


@pytest.mark.django_db
def test_the_editor_refuses_a_min_length_over_the_max_length(admin_client, lookup: McpTool) -> None:  # noqa: F811
    status, page = post(
        admin_client,
        lookup,
        **{"contract-0-args__0__min_length": "30", "contract-0-args__0__max_length": "20"},
    )
    assert status == 200
    assert any("min_length (30) is greater than max_length (20): no value fits" in e for e in errors(page)), errors(
        page
    )
    assert "min_length" not in ToolContract.objects.get(tool=lookup).args["name"]


@pytest.mark.django_db
def test_the_json_view_names_min_length_among_the_valid_keys(admin_client, lookup: McpTool) -> None:  # noqa: F811
    document = {"args": {"name": {"type": "str", "min_len": 2}}}
    status, page = post(admin_client, lookup, **{"contract-0-contract_json": json.dumps(document)})
    assert status == 200
    [message] = [e for e in errors(page) if "min_len" in e]
    assert "did you mean &#x27;min_length&#x27;?" in message or "did you mean 'min_length'?" in message
    assert "min_length" in message.split("valid keys are:")[1]
