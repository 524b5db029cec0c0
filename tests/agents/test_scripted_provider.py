"""The scripted model provider replays canned model turns: tests and demos may use it, production admins are never
offered it (``PLATFORM_ALLOW_SCRIPTED_MODEL``, on with ``DEBUG``)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError

from agents.admin import AgentForm
from agents.llm import build_chat_model
from agents.models import Agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def production(settings: Any) -> None:
    settings.PLATFORM_ALLOW_SCRIPTED_MODEL = False


def test_an_agent_on_the_scripted_provider_is_refused_in_production(production: None) -> None:
    agent = Agent(slug="canned", name="canned", model_provider="scripted")
    with pytest.raises(ValidationError) as refused:
        agent.full_clean()
    assert "PLATFORM_ALLOW_SCRIPTED_MODEL" in str(refused.value.message_dict["model_provider"])


def test_the_admin_form_does_not_offer_the_scripted_provider_in_production(production: None) -> None:
    offered = [value for value, _label in AgentForm().fields["model_provider"].choices]
    assert "scripted" not in offered and {"offline", "bedrock"} <= set(offered)


def test_a_stored_scripted_agent_cannot_run_in_production(production: None) -> None:
    with pytest.raises(ValueError, match="not allowed"):
        build_chat_model(provider="scripted", model_id="", params={"script": []}, offline_answer="")


def test_tests_and_debug_may_use_it() -> None:
    Agent(
        slug="canned", name="canned", model_provider="scripted", model_params={"script": [{"content": "ok"}]}
    ).full_clean()
    assert "scripted" in [value for value, _label in AgentForm().fields["model_provider"].choices]


def test_a_run_of_a_stored_scripted_agent_fails_as_a_value_in_production(demo_server: Any, settings: Any) -> None:
    from agents.execution import run_execute
    from agents.models import Run
    from tests.conftest import make_agent

    agent = make_agent(slug="canned", servers=[demo_server], provider="scripted", script=[], with_demo_rules=False)
    settings.PLATFORM_ALLOW_SCRIPTED_MODEL = False
    run = Run.objects.create(agent=agent, query="안녕하세요")
    run_execute(run_id=run.pk)
    run.refresh_from_db()
    assert (run.status, run.error_code) == ("failed", "model:unavailable")
