"""A model API key that no HTTP client can send (a Korean character, a pasted zero-width space, a line break) is
refused where it is given: the admin's agent page and import_config (the secrets review). Saved, every run of the
agent failed before its request, as an encoding error or as "the model server could not be reached"."""

from __future__ import annotations

from typing import Any

import pytest

from agent_platform.errors import ApplicationError
from agents.configuration import config_import
from agents.models import Agent
from tests.agents.test_agent_form import agent_post

pytestmark = pytest.mark.django_db

REFUSAL = "The model API key can be sent only as visible ASCII text on one line"
UNSENDABLE = ["sk-abc\u200bdef0123456789", "한국어모델키값비밀0123456", "sk-abc\ndef0123456789", "sk-abc def"]


def openai_agent_post(key: str) -> dict[str, object]:
    return agent_post(
        slug="keyed",
        model_provider="openai_compatible",
        model_id="m",
        model_params='{"base_url": "http://127.0.0.1:9/v1"}',
        new_model_api_key=key,
    )


@pytest.mark.parametrize("key", UNSENDABLE)
def test_the_agent_page_refuses_a_key_no_http_client_can_send(admin_client: Any, key: str) -> None:
    response = admin_client.post("/admin/agents/agent/add/", openai_agent_post(key))
    assert response.status_code == 200 and REFUSAL in response.content.decode()
    assert key not in response.content.decode()  # never shown back
    assert not Agent.objects.filter(slug="keyed").exists()


def test_the_agent_page_takes_an_ascii_key(admin_client: Any) -> None:
    response = admin_client.post("/admin/agents/agent/add/", openai_agent_post("sk-live_0123456789abcdef"))
    assert response.status_code == 302
    assert Agent.objects.get(slug="keyed").model_api_key() == "sk-live_0123456789abcdef"


def test_import_config_refuses_a_key_no_http_client_can_send() -> None:
    document = {
        "agents": [
            {
                "slug": "imported",
                "name": "imported",
                "model": {
                    "provider": "openai_compatible",
                    "model_id": "m",
                    "params": {"base_url": "http://127.0.0.1:9/v1"},
                    "secrets": {"api_key": {"value": "한국어모델키값비밀0123456"}},
                },
            }
        ]
    }
    with pytest.raises(ApplicationError) as refused:
        config_import(document=document, actor="system:test")
    assert REFUSAL in str(refused.value) and "한국어모델키값비밀" not in str(refused.value)
    assert not Agent.objects.filter(slug="imported").exists()
