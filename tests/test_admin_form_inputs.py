"""Admin form inputs that were a server error, silently lost or saved unusable (the review of the admin forms):
numbers too large for a float, empty path segments, lines redrawn as JSON, a setting given twice, allowed values
of the wrong type, and a tool_choice object."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest

from agents.models import Agent
from mcpregistry.contract_form import _number
from mcpregistry.discovery_view import limits_text
from mcpregistry.list_fields import object_from_path_lines, typed_value, value_text
from tests.agents.test_agent_form import agent_post
from tests.agents.test_rule_editor import ledger, rule_post  # noqa: F401
from tests.mcpregistry.test_contract_editor import editor_post, lookup  # noqa: F401
from tests.mcpregistry.test_registry import post_server_form

pytestmark = pytest.mark.django_db


def errors(page: str) -> str:
    found = re.findall(r'<ul class="errorlist[^>]*>(.*?)</ul>', page, re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", e)) for e in found)


def lines_post(lines: str) -> dict[str, Any]:
    data = agent_post()
    data.pop("model_params")
    data.update({"model_params__editor": "1", "model_params__lines": lines})
    return data


def shown_lines(page: str) -> str | None:
    shown = re.search(r'name="model_params__lines"[^>]*>(.*?)</textarea>', page, re.S)
    return html.unescape(shown.group(1)).strip() if shown else None


# --- numbers too large for a float (1e400) ------------------------------------------------------------------------


def test_a_number_too_large_for_a_float_stays_text_and_reads_back() -> None:
    assert typed_value("1e400") == "1e400"
    assert typed_value("-1e400") == "-1e400"
    assert value_text("1e400") == '"1e400"'  # quoted, so a line refusing the number keeps the text
    assert typed_value("1.5") == 1.5


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_a_matcher_value_too_large_for_a_float_is_refused_not_a_500(admin_client, ledger, lang) -> None:  # noqa: F811
    admin_client.raise_request_exception = False
    response = admin_client.post(
        "/admin/agents/deterministicrule/add/", rule_post(ledger, when__context="tier=1e400"), HTTP_ACCEPT_LANGUAGE=lang
    )
    assert response.status_code == 200
    assert "tier" in errors(response.content.decode())


def test_model_params_lines_with_a_larger_than_float_number_are_kept_as_typed(admin_client) -> None:
    admin_client.raise_request_exception = False
    response = admin_client.post("/admin/agents/agent/add/", lines_post("latency_s=1e400"))
    assert response.status_code == 200 and not Agent.objects.exists()
    page = response.content.decode()
    assert shown_lines(page) == "latency_s=1e400"
    assert "line 1" in errors(page)


def test_model_params_posted_as_json_with_a_non_finite_number_are_refused_at_the_field(admin_client) -> None:
    admin_client.raise_request_exception = False
    response = admin_client.post("/admin/agents/agent/add/", agent_post(model_params='{"temperature": 1e400}'))
    assert response.status_code == 200 and not Agent.objects.exists()
    assert "finite" in errors(response.content.decode())


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_an_argument_max_length_too_large_for_a_float_is_refused_not_a_500(admin_client, lookup, lang) -> None:  # noqa: F811
    admin_client.raise_request_exception = False
    response = admin_client.post(
        f"/admin/mcpregistry/mcptool/{lookup.pk}/change/",
        editor_post(lookup, **{"contract-0-args__1__max_length": "1e400"}),
        HTTP_ACCEPT_LANGUAGE=lang,
    )
    assert response.status_code == 200
    assert "max_length" in errors(response.content.decode())


def test_a_contract_number_that_is_not_finite_stays_as_typed() -> None:
    assert _number("1e400") == "1e400"
    assert _number("nan") == "nan"
    assert _number(" 12 ") == 12 and _number("2.5") == 2.5 and _number("1" + "0" * 400) == 10**400


def test_a_schema_count_that_is_not_a_whole_number_is_shown_not_a_500() -> None:
    assert "inf" in limits_text({"maxLength": float("inf")})
    assert "2.5" in limits_text({"maxItems": 2.5})


# --- model parameter lines -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("typed", ["retry.on=throttled, tiemout", ".temperature=1", "retry..max_attempts=3"])
def test_refused_model_parameter_lines_are_shown_again_as_typed(admin_client, typed) -> None:
    page = admin_client.post("/admin/agents/agent/add/", lines_post(typed)).content.decode()
    assert shown_lines(page) == typed, "the lines were replaced by a JSON box or redrawn"


def test_an_empty_segment_in_a_model_parameter_path_names_the_line(admin_client) -> None:
    page = admin_client.post("/admin/agents/agent/add/", lines_post("temperature=0.2\nretry..max_attempts=3")).content
    assert "line 2" in errors(page.decode())


@pytest.mark.parametrize("path", ["retry..max_attempts", ".a", "a.", "a. .b"])
def test_a_path_with_an_empty_part_is_refused_naming_the_line(path) -> None:
    with pytest.raises(ValueError, match="line 2"):
        object_from_path_lines(f"x=1\n{path}=3")


# --- a server's settings, a contract's allowed values --------------------------------------------------------------


def test_an_environment_setting_given_twice_is_refused_naming_the_line(admin_client, demo_server) -> None:
    response = post_server_form(admin_client, demo_server, env_settings="FAILURE_MODE=none\nFAILURE_MODE=timeout")
    assert response.status_code == 200
    assert "Line 2: FAILURE_MODE is given twice." in errors(response.content.decode())


def test_an_allowed_value_of_the_wrong_type_is_refused_naming_the_argument(admin_client, lookup) -> None:  # noqa: F811
    response = admin_client.post(
        f"/admin/mcpregistry/mcptool/{lookup.pk}/change/",
        editor_post(lookup, **{"contract-0-args__1__allowed": "1, 2, x"}),
    )
    assert response.status_code == 200
    assert "limit" in errors(response.content.decode())


# --- tool_choice as an object ----------------------------------------------------------------------------------------


def test_a_tool_choice_object_is_checked_like_a_tool_name(admin_client) -> None:
    response = admin_client.post(
        "/admin/agents/agent/add/", lines_post('tool_choice={"type": "tool", "name": "nosuch"}')
    )
    assert response.status_code == 200
    assert "tool_choice" in errors(response.content.decode())


def test_a_tool_choice_object_naming_no_tool_is_refused_with_the_forms(admin_client) -> None:
    response = admin_client.post("/admin/agents/agent/add/", lines_post('tool_choice={"type": "tool"}'))
    assert response.status_code == 200 and not Agent.objects.exists()
    assert "an object naming the tool" in errors(response.content.decode())
