"""An eval set's name says what it may hold (ASCII letters, digits, _ and -) in the platform's own words, on the
admin, the API and ``import_config``, not in Django's slug message, whose Korean reads as if Hangul were letters it
took. And the notes the platform itself writes on the versions it publishes are shown in the reader's language on
the versions admin, while a note an admin typed is shown as typed (both stay stored as written)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import translation
from django.utils.html import escape
from rest_framework.test import APIClient

from agent_platform.slugs import ASCII_SLUG_REFUSAL, validate_ascii_slug
from agents.admin_versions import version_note_text
from agents.models import Agent
from agents.services import agent_version_publish, agent_version_rollback, api_key_create
from evals.models import EvalSet
from evals.services import EVAL_FREEZE_NOTE

pytestmark = pytest.mark.django_db

KOREAN_NAME = "기본평가"
# Django's own Korean slug message ("only letters, numbers, _ and -"), which Hangul seem to satisfy.
DJANGO_SLUG_MESSAGE_KO = "문자, 숫자"


def _refusal_in(language: str) -> str:
    with translation.override(language):
        return str(ASCII_SLUG_REFUSAL)


def _superuser_client() -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw-123-long-Enough"))
    return client


# ---- the set's name --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["seed-001-tools", "A_b-9", "x"])
def test_an_ascii_slug_is_a_name(name: str) -> None:
    validate_ascii_slug(name)


@pytest.mark.parametrize("name", [KOREAN_NAME, "café", "two words", "a/b", "tools\n", "ａｂｃ"])
def test_anything_else_is_refused_saying_what_a_name_may_hold(name: str) -> None:
    with pytest.raises(ValidationError) as refused, translation.override("en"):
        validate_ascii_slug(name)
    assert refused.value.messages == [
        "Use ASCII letters (a–z, A–Z), digits, _ and - only (e.g. team-a_v2): the name is used in URLs and commands."
    ]


def test_the_admins_add_page_says_what_a_name_may_hold() -> None:
    with translation.override("en"):
        page = _superuser_client().get("/admin/evals/evalset/add/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert "ASCII letters (a–z, A–Z), digits, _ and - only, e.g. seed-001-tools" in page


def test_the_admin_refuses_a_korean_name_in_the_platforms_words_not_djangos() -> None:
    data = {"name": KOREAN_NAME, "description": "", "agent": "", "thresholds": "{}"}
    data |= {"cases-TOTAL_FORMS": "0", "cases-INITIAL_FORMS": "0"}
    response = _superuser_client().post("/admin/evals/evalset/add/", data, HTTP_ACCEPT_LANGUAGE="ko")
    assert response.status_code == 200  # the form again
    page = response.content.decode()
    assert escape(_refusal_in("ko")) in page
    assert DJANGO_SLUG_MESSAGE_KO not in page
    assert not EvalSet.objects.exists()


def test_the_api_refuses_a_korean_name_in_the_platforms_words(db: Any) -> None:
    _key, raw = api_key_create(actor="test", via="tests", name="ops", admin=True)
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    document = {"name": KOREAN_NAME, "cases": []}
    response = client.post("/api/v1/evals/sets", document, format="json", HTTP_ACCEPT_LANGUAGE="ko")
    assert response.status_code == 400, response.content
    message = response.json()["error"]["message"]
    assert f"name: {_refusal_in('ko')}" in message and DJANGO_SLUG_MESSAGE_KO not in message
    assert not EvalSet.objects.exists()


def test_import_config_refuses_a_korean_name_in_the_platforms_words(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"eval_sets": [{"name": KOREAN_NAME, "cases": []}]}), encoding="utf-8")
    with translation.override("en"), pytest.raises(CommandError) as refused:
        call_command("import_config", str(path), stdout=io.StringIO(), stderr=io.StringIO())
    assert _refusal_in("en") in str(refused.value)
    assert not EvalSet.objects.exists()


# ---- the notes the platform writes on versions -----------------------------------------------------------------


@pytest.fixture
def marked_translation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The versions admin's gettext marks what it translates (the Korean catalog is the lead's to fill): a note
    shown through it reads "[번역] ...", one shown as stored does not."""
    monkeypatch.setattr("agents.admin_versions.gettext", lambda text: f"[번역] {text}")


def _versions_with_notes() -> dict[str, Any]:
    """v1 published on save, v2 frozen for an eval, v3 with a typed note, v4 a roll back to v1, each with the note
    its writer stores (each of other content: a publish of the live content changes nothing)."""
    agent = Agent.objects.create(slug="notes", name="notes", system_prompt="one")
    saved = agent_version_publish(agent=agent, actor="test", via="tests", note="published on save")
    Agent.objects.filter(pk=agent.pk).update(system_prompt="two")
    frozen = agent_version_publish(agent=agent, actor="test", via="tests", note=EVAL_FREEZE_NOTE, make_live=False)
    Agent.objects.filter(pk=agent.pk).update(system_prompt="three")
    typed = agent_version_publish(agent=agent, actor="test", via="tests", note="roll back to v1 (고객 요청)")
    Agent.objects.filter(pk=agent.pk).update(system_prompt="one")
    rolled = agent_version_publish(agent=agent, actor="test", via="tests", note="roll back to v1")
    return {"saved": saved, "frozen": frozen, "typed": typed, "rolled": rolled}


@pytest.mark.usefixtures("marked_translation")
def test_the_versions_list_shows_system_notes_in_the_readers_language_and_typed_ones_as_typed() -> None:
    _versions_with_notes()
    page = _superuser_client().get("/admin/agents/agentversion/").content.decode()
    assert escape("[번역] published on save") in page
    assert escape(f"[번역] {EVAL_FREEZE_NOTE}") in page
    assert escape("[번역] roll back to v1") in page
    assert escape("roll back to v1 (고객 요청)") in page and escape("[번역] roll back to v1 (") not in page


@pytest.mark.usefixtures("marked_translation")
def test_a_versions_page_and_the_diff_page_show_its_note_in_the_readers_language() -> None:
    versions = _versions_with_notes()
    client = _superuser_client()
    page = client.get(f"/admin/agents/agentversion/{versions['rolled'].pk}/change/").content.decode()
    assert escape("[번역] roll back to v1") in page
    diff = client.get(f"/admin/agents/agentversion/{versions['rolled'].pk}/diff/").content.decode()
    assert escape("v1 [번역] published on save") in diff
    assert escape(f"v2 [번역] {EVAL_FREEZE_NOTE}") in diff
    assert escape("v3 roll back to v1 (고객 요청)") in diff


@pytest.mark.slow  # the first roll back in a process loads what checks a version's content
@pytest.mark.usefixtures("marked_translation")
def test_a_roll_back_stores_its_note_as_written_and_the_admin_shows_it_translated() -> None:
    agent = Agent.objects.create(slug="notes", name="notes", system_prompt="one")
    first = agent_version_publish(agent=agent, actor="test", via="tests")
    Agent.objects.filter(pk=agent.pk).update(system_prompt="two")
    agent_version_publish(agent=agent, actor="test", via="tests")
    rolled = agent_version_rollback(version=first, actor="test", via="tests")
    assert rolled.note == "roll back to v1"
    assert version_note_text(rolled.note) == "[번역] roll back to v1"
