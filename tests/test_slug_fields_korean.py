"""The ASCII slugs an admin types (an agent's slug, an A/B arm's name, an MCP server's id, an eval set's name) say
what they may hold in the platform's own words (``agent_platform.slugs``), on the admin's forms, in
``import_config`` and in ``full_clean``: Django's slug message, in Korean "문자, 숫자, '_', '-'만 가능합니다.", read as
if the Hangul of "회사도우미" were letters it took. Values stored before (ASCII slugs) keep working."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import models
from django.test import Client
from django.utils import translation
from django.utils.html import escape

from agent_platform.slugs import ASCII_SLUG_REFUSAL, validate_ascii_slug
from agents.models import Agent, AgentArm
from evals.models import EvalSet
from mcpregistry.models import McpServer
from tests.agents.test_agent_form import agent_post
from tests.mcpregistry.test_registry import post_server_form

pytestmark = pytest.mark.django_db

KOREAN_SLUG = "회사도우미"
# Django's own Korean slug message ("only letters, numbers, _ and -"), which Hangul seem to satisfy.
DJANGO_SLUG_MESSAGE_KO = "문자, 숫자"

# Each slug field, a value of it an admin would type (its help's example) and its length (the SlugField's).
SLUG_FIELDS: list[tuple[type[models.Model], str, str, int]] = [
    (Agent, "slug", "company-assistant", 64),
    (AgentArm, "name", "a", 32),
    (McpServer, "mcp_id", "sds-company-data", 64),
    (EvalSet, "name", "seed-001-tools", 100),
]


def _in(language: str, text: Any) -> str:
    with translation.override(language):
        return str(text)


def _refusals_of(model: type[models.Model], field: str, value: str, language: str) -> list[str]:
    """What ``full_clean`` says of ``field`` holding ``value`` (the other fields may be refused too: not read)."""
    with translation.override(language):
        try:
            model(**{field: value}).full_clean()
        except ValidationError as refused:
            return [str(message) for message in refused.message_dict.get(field, [])]
    return []


def _korean_client(client: Client) -> Client:
    client.cookies["django_language"] = "ko"
    return client


# ---- the one check ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["company-assistant", "sds-company-data", "a", "control", "A_b-9", "x"])
def test_an_ascii_slug_passes(value: str) -> None:
    validate_ascii_slug(value)


@pytest.mark.parametrize("value", [KOREAN_SLUG, "café", "two words", "a/b", "tools\n", "ａｂｃ", ""])
def test_anything_else_is_refused_naming_the_characters_a_slug_may_hold(value: str) -> None:
    with pytest.raises(ValidationError) as refused, translation.override("en"):
        validate_ascii_slug(value)
    assert refused.value.messages == [
        "Use ASCII letters (a–z, A–Z), digits, _ and - only (e.g. team-a_v2): the name is used in URLs and commands."
    ]


# ---- every slug field ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "field", "value", "length"), SLUG_FIELDS)
def test_full_clean_refuses_a_korean_value_in_the_platforms_words_not_djangos(
    model: type[models.Model], field: str, value: str, length: int
) -> None:
    assert _refusals_of(model, field, KOREAN_SLUG, "ko") == [_in("ko", ASCII_SLUG_REFUSAL)]
    assert _refusals_of(model, field, KOREAN_SLUG, "en") == [_in("en", ASCII_SLUG_REFUSAL)]


@pytest.mark.parametrize(("model", "field", "value", "length"), SLUG_FIELDS)
def test_a_stored_ascii_slug_still_passes_full_clean(
    model: type[models.Model], field: str, value: str, length: int
) -> None:
    assert _refusals_of(model, field, value, "ko") == []
    assert _refusals_of(model, field, "x" * length, "ko") == []


@pytest.mark.parametrize(("model", "field", "value", "length"), SLUG_FIELDS)
def test_each_slug_field_is_text_of_its_length_with_an_example_in_its_help(
    model: type[models.Model], field: str, value: str, length: int
) -> None:
    column = model._meta.get_field(field)
    assert type(column) is models.CharField  # not a SlugField, whose form field has Django's message
    assert column.max_length == length
    assert validate_ascii_slug in column.validators
    assert f"e.g. {value}" in _in("en", column.help_text)
    # Where a value is looked up: unique, or indexed as the SlugField was.
    assert column.unique or column.db_index


# ---- the admin, in Korean --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "model", "field", "example"),
    [
        ("/admin/agents/agent/add/", Agent, "slug", "company-assistant"),
        ("/admin/mcpregistry/mcpserver/add/", McpServer, "mcp_id", "sds-company-data"),
        ("/admin/agents/agentarm/add/", AgentArm, "name", "control"),
    ],
)
def test_a_korean_add_page_shows_the_fields_help_with_its_example(
    admin_client: Client, url: str, model: type[models.Model], field: str, example: str
) -> None:
    page = _korean_client(admin_client).get(url).content.decode()
    help_text = _in("ko", model._meta.get_field(field).help_text)
    assert example in help_text and escape(help_text) in page
    assert DJANGO_SLUG_MESSAGE_KO not in page


def test_the_admin_refuses_a_korean_agent_slug_in_the_platforms_words(admin_client: Client) -> None:
    response = _korean_client(admin_client).post("/admin/agents/agent/add/", agent_post(slug=KOREAN_SLUG))
    assert response.status_code == 200  # the form again
    page = response.content.decode()
    assert escape(_in("ko", ASCII_SLUG_REFUSAL)) in page
    assert DJANGO_SLUG_MESSAGE_KO not in page
    assert not Agent.objects.exists()


def test_the_admin_refuses_a_korean_server_id_in_the_platforms_words(admin_client: Client) -> None:
    response = post_server_form(_korean_client(admin_client), None, mcp_id=KOREAN_SLUG)
    assert response.status_code == 200  # the form again
    page = response.content.decode()
    assert escape(_in("ko", ASCII_SLUG_REFUSAL)) in page
    assert DJANGO_SLUG_MESSAGE_KO not in page
    assert not McpServer.objects.filter(mcp_id=KOREAN_SLUG).exists()


def test_the_admin_still_adds_an_agent_and_a_server_with_an_ascii_slug(admin_client: Client) -> None:
    response = admin_client.post("/admin/agents/agent/add/", agent_post(slug="company-assistant"))
    assert response.status_code == 302, response.content.decode()[:2000]
    response = post_server_form(admin_client, None, mcp_id="sds-company-data")
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Agent.objects.filter(slug="company-assistant").exists()
    assert McpServer.objects.filter(mcp_id="sds-company-data").exists()


# ---- import_config ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "document",
    [
        {"servers": [{"mcp_id": KOREAN_SLUG, "command": sys.executable}]},
        {"agents": [{"slug": KOREAN_SLUG}]},
    ],
    ids=["server", "agent"],
)
def test_import_config_refuses_a_korean_slug_in_the_platforms_words(tmp_path: Path, document: dict[str, Any]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    with translation.override("ko"), pytest.raises(CommandError) as refused:
        call_command("import_config", str(path), stdout=io.StringIO(), stderr=io.StringIO())
    assert _in("ko", ASCII_SLUG_REFUSAL) in str(refused.value)
    assert DJANGO_SLUG_MESSAGE_KO not in str(refused.value)
    assert not Agent.objects.exists() and not McpServer.objects.filter(mcp_id=KOREAN_SLUG).exists()
