"""Defects 5 and 6 of the Korean admin crawl.

5. ``run_query --context`` that is no JSON quoted Python's own English parse error inside a Korean sentence
   ("--context가 JSON이 아님: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"); it says
   what is wrong and where in the platform's language now, as the API and ``import_config`` do (``json_error_text``).
6. After the Publish action (and a roll back) the message began with the agent's slug, which the admin's
   ``{{ message|capfirst }}`` capitalised ("Company-assistant: v1이(가) 라이브입니다."); the messages begin with a word
   now, so the slug reads as it is written.
"""

from __future__ import annotations

import html
import re

import pytest
from django.core.management import CommandError, call_command
from django.test import Client, override_settings
from django.utils import translation

from agents.models import Agent, AgentVersion
from agents.services import agent_version_publish

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("language", "expected"),
    [
        ("ko", "--context가 JSON이 아님: 1행 2열: 큰따옴표로 감싼 키가 와야 합니다"),
        ("en", "--context is not JSON: a key in double quotes was expected, at line 1, column 2"),
    ],
    ids=["ko", "en"],
)
def test_run_query_says_why_its_context_is_no_json_in_the_platforms_language(language: str, expected: str) -> None:
    with (
        override_settings(LANGUAGE_CODE=language),
        translation.override(language),
        pytest.raises(CommandError) as refused,
    ):
        call_command("run_query", "nobody", "안녕", "--context", "{bad: 1}")

    assert str(refused.value) == expected
    assert "Expecting property name" not in str(refused.value)


def test_run_query_refuses_a_context_nested_past_the_recursion_limit_as_no_json() -> None:
    with pytest.raises(CommandError) as refused:
        call_command("run_query", "nobody", "hello", "--context", "[" * 100_000)
    assert str(refused.value) == "--context is not JSON: the JSON is nested too deeply, at line 1, column 1"


def _agent() -> Agent:
    return Agent.objects.create(slug="company-assistant", name="Company assistant", system_prompt="Answer briefly.")


def _success_messages(page: str) -> list[str]:
    return [html.unescape(text) for text in re.findall(r'<li class="success">(.*?)</li>', page, re.S)]


@pytest.mark.parametrize("language", ["ko", "en"])
def test_the_publish_message_shows_the_slug_as_written(admin_client: Client, language: str) -> None:
    agent = _agent()

    page = admin_client.post(
        "/admin/agents/agent/",
        {"action": "publish", "_selected_action": [agent.pk]},
        HTTP_ACCEPT_LANGUAGE=language,
        follow=True,
    ).content.decode()

    with translation.override(language):
        expected = translation.gettext("Agent %(agent)s: v%(number)s is live.") % {
            "agent": "company-assistant",
            "number": 1,
        }
    assert _success_messages(page) == [expected]
    assert "Company-assistant" not in page
    if language == "en":
        assert expected == "Agent company-assistant: v1 is live."


@pytest.mark.parametrize("language", ["ko", "en"])
def test_the_rollback_message_shows_the_slug_as_written(admin_client: Client, language: str) -> None:
    agent = _agent()
    v1 = agent_version_publish(agent=agent, actor="test-admin", via="tests")
    agent.system_prompt = "Answer in one sentence."
    agent.save()
    agent_version_publish(agent=agent, actor="test-admin", via="tests")

    page = admin_client.post(
        "/admin/agents/agentversion/",
        {"action": "rollback", "_selected_action": [v1.pk]},
        HTTP_ACCEPT_LANGUAGE=language,
        follow=True,
    ).content.decode()

    assert AgentVersion.objects.filter(agent=agent).count() == 3
    with translation.override(language):
        expected = translation.gettext("Agent %(agent)s: v%(old)s published again as v%(new)s, now live.") % {
            "agent": "company-assistant",
            "old": 1,
            "new": 3,
        }
    assert _success_messages(page) == [expected]
    assert "Company-assistant" not in page
    if language == "en":
        assert expected == "Agent company-assistant: v1 published again as v3, now live."
