"""The agent page's review fixes (s44): a model API key typed on a refused page is said to be not kept; a key is
refused for a provider that reads none and model parameters the provider never reads are said; the agent's own
validation tells every problem at once; the settings editors show a text of tags and a prompt without a server as
they are; the scripted provider needs its script."""

from __future__ import annotations

import html
import re

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from agents.agent_settings_form import McpContextWidget, ToolSelectionWidget
from agents.models import Agent
from tests.agents.test_agent_form import agent_post

pytestmark = pytest.mark.django_db

NOT_KEPT = "The key typed here was not kept, as the page was refused: type it again."
OLD_KEY, NEW_KEY = "sk-old-0123456789abcdef", "sk-new-fedcba9876543210"


def _errors(page: str) -> str:
    return html.unescape(" ".join(re.findall(r'<ul class="errorlist[^>]*>(.*?)</ul>', page, re.S)))


def openai_post(**changes: object) -> dict[str, object]:
    fields: dict[str, object] = {
        "slug": "keyed",
        "model_provider": "openai_compatible",
        "model_id": "m",
        "model_params": '{"base_url": "http://127.0.0.1:9/v1"}',
    }
    return agent_post(**{**fields, **changes})


@pytest.mark.slow
def test_a_key_typed_on_a_refused_page_is_said_to_be_not_kept(admin_client: Client) -> None:
    assert admin_client.post("/admin/agents/agent/add/", openai_post(new_model_api_key=OLD_KEY)).status_code == 302
    agent = Agent.objects.get(slug="keyed")

    page = admin_client.post(
        f"/admin/agents/agent/{agent.pk}/change/", openai_post(new_model_api_key=NEW_KEY, max_iterations="-5")
    ).content.decode()
    errors = _errors(page)
    assert NOT_KEPT in errors and "greater than or equal to 0" in errors
    assert NEW_KEY not in page and OLD_KEY not in page  # never sent back
    assert Agent.objects.get(pk=agent.pk).model_api_key() == OLD_KEY

    # A new agent's page likewise; a page with no key typed says nothing of one.
    page = admin_client.post(
        "/admin/agents/agent/add/", openai_post(slug="fresh", new_model_api_key=NEW_KEY, time_limit_s="0")
    ).content.decode()
    assert NOT_KEPT in _errors(page) and NEW_KEY not in page
    page = admin_client.post("/admin/agents/agent/add/", openai_post(slug="fresh", time_limit_s="0")).content.decode()
    assert NOT_KEPT not in _errors(page)


@pytest.mark.parametrize(
    ("provider", "model_id", "why"),
    [("bedrock", "anthropic.claude-3-haiku", "the worker's AWS credentials"), ("offline", "", "reads no API key")],
)
def test_a_key_for_a_provider_that_reads_none_is_refused_saying_why(
    admin_client: Client, provider: str, model_id: str, why: str
) -> None:
    data = agent_post(model_provider=provider, model_id=model_id, new_model_api_key=NEW_KEY)
    page = admin_client.post("/admin/agents/agent/add/", data).content.decode()
    assert why in _errors(page) and NEW_KEY not in page
    assert not Agent.objects.exists()
    data = agent_post(model_provider=provider, model_id=model_id, model_api_key_from_env="MODEL_KEY")
    assert why in _errors(admin_client.post("/admin/agents/agent/add/", data).content.decode())
    assert not Agent.objects.exists()


@pytest.mark.parametrize(
    ("provider", "model_id", "params", "unread"),
    [
        ("bedrock", "anthropic.claude-3-haiku", {"base_url": "http://127.0.0.1:9/v1", "temperature": 0.2}, "base_url"),
        ("offline", "", {"temperature": 0.2, "stream": True}, "temperature, stream"),
        (
            "openai_compatible",
            "m",
            {"base_url": "http://127.0.0.1:9/v1", "region_name": "us-east-1", "guardrail": {"id": "g"}},
            "region_name, guardrail",
        ),
    ],
)
def test_model_parameters_the_provider_never_reads_are_said_on_save(
    admin_client: Client, provider: str, model_id: str, params: dict[str, object], unread: str
) -> None:
    import json

    data = agent_post(model_provider=provider, model_id=model_id, model_params=json.dumps(params))
    response = admin_client.post("/admin/agents/agent/add/", data, follow=True)
    said = [str(m) for m in response.context["messages"]]
    assert any(
        f"the {provider} provider does not read the model parameter" in m and f" {unread};" in m for m in said
    ), said
    agent = Agent.objects.get(slug="flowing")
    # Saved again unchanged, it is not said again.
    response = admin_client.post(f"/admin/agents/agent/{agent.pk}/change/", data, follow=True)
    assert not any("does not read" in str(m) for m in response.context["messages"])


def test_every_problem_of_the_agent_is_told_at_once() -> None:
    agent = Agent(slug="many", name="many", time_limit_s=0, shadow_sample_rate=1.5, max_iterations=0)
    with pytest.raises(ValidationError) as refused:
        agent.full_clean()
    assert {"time_limit_s", "shadow_sample_rate", "max_iterations"} <= set(refused.value.message_dict)


def test_tags_given_as_a_text_are_shown_as_typed_not_split_into_letters() -> None:
    page = ToolSelectionWidget().render("tool_selection", '{"enabled": true, "tags": "인사"}')
    assert 'value="인사"' in page and "인, 사" not in page
    page = ToolSelectionWidget().render("tool_selection", '{"enabled": true, "tags": ["인사", "급여"]}')
    assert 'value="인사, 급여"' in page


def test_a_prompt_without_a_server_is_labelled_so() -> None:
    page = McpContextWidget().render("mcp_context", '{"prompt": {"name": "nope"}}')
    assert "(no server): nope" in page and "None: nope" not in page


def test_the_scripted_provider_needs_its_script() -> None:
    agent = Agent(slug="scripted", name="scripted", model_provider="scripted", model_params={})
    with pytest.raises(ValidationError) as refused:
        agent.full_clean()
    assert 'replays the model turns of "script"' in " ".join(refused.value.message_dict["model_params"])
    agent.model_params = {"script": [{"content": "안녕하세요"}]}
    agent.full_clean()
