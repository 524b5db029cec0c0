"""A published version's run sends the agent's model key only to the endpoint the agent is stored with: a version
frozen with another OpenAI-compatible base URL (a rollback, the live version under a draft moved to another
vendor, a shadow candidate, an eval of it) fails ``config:model_endpoint_changed`` before any model request, and
its old host never sees the key entered for the new one. Two real OpenAI-compatible servers stand for the two
vendors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from agents.execution import run_execute
from agents.models import Agent, Run
from agents.services import (
    agent_shadow_set,
    agent_update,
    agent_version_publish,
    agent_version_rollback,
    run_create,
)
from tests.conftest import make_agent
from tests.openai_server import ScriptedOpenAIServer

pytestmark = pytest.mark.django_db

OLD_KEY = "sk-self-hosted-key-aaaa1111"
NEW_KEY = "sk-hosted-vendor-key-bbbb2222"
ROTATED_KEY = "sk-self-hosted-key-cccc3333"
ADMIN = "test-admin"


@contextmanager
def two_vendors() -> Iterator[tuple[ScriptedOpenAIServer, ScriptedOpenAIServer]]:
    with (
        ScriptedOpenAIServer([{"content": "from the old host"}] * 5).running() as old,
        ScriptedOpenAIServer([{"content": "from the new host"}] * 5).running() as new,
    ):
        yield old, new


def llm_agent(demo_server: Any, base_url: str, key: str | None) -> Agent:
    agent = make_agent(slug="llm", servers=[demo_server], provider="openai_compatible", with_demo_rules=False)
    data: dict[str, Any] = {"model_id": "m", "model_params": {"base_url": base_url}}
    if key is not None:
        data["model_secrets"] = {"api_key": key}
    agent_update(agent=agent, actor=ADMIN, via="tests", data=data)
    return agent


def move_to(agent: Agent, base_url: str, key: str | None) -> None:
    """The admin points the agent at another endpoint (and enters its key); a draft until published."""
    data: dict[str, Any] = {"model_params": {"base_url": base_url}}
    if key is not None:
        data["model_secrets"] = {"api_key": key}
    agent_update(agent=agent, actor=ADMIN, via="tests", data=data)


def executed(run: Run) -> Run:
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def live_run() -> Run:
    return executed(run_create(agent_slug="llm", query="hi", api_key=None))


def keys_sent(server: ScriptedOpenAIServer) -> list[str | None]:
    return [request["headers"].get("authorization") for request in server.requests]


def assert_failed_unsent(run: Run, version_url: str) -> None:
    assert (run.status, run.error_code) == (Run.Status.FAILED, "config:model_endpoint_changed"), run.error_message
    # The message names the version's endpoint and what to do, never the key.
    assert version_url in run.error_message
    # In the agent's language (the demo agent's is Korean): what to do.
    assert "현재 엔드포인트로 버전을 게시하거나" in run.error_message
    assert NEW_KEY not in run.error_message


@pytest.mark.slow
def test_a_rolled_back_version_does_not_send_the_new_vendors_key_to_its_old_host(demo_server: Any) -> None:
    with two_vendors() as (old, new):
        agent = llm_agent(demo_server, old.base_url, OLD_KEY)
        v1 = agent_version_publish(agent=agent, actor=ADMIN, via="tests")
        move_to(agent, new.base_url, NEW_KEY)
        agent_version_publish(agent=agent, actor=ADMIN, via="tests")
        assert live_run().status == Run.Status.SUCCEEDED
        assert keys_sent(new) == [f"Bearer {NEW_KEY}"]

        agent_version_rollback(version=v1, actor=ADMIN, via="tests")
        run = live_run()

    assert_failed_unsent(run, old.base_url)
    assert old.requests == []  # no request at all, so none carrying the new key
    assert len(new.requests) == 1


@pytest.mark.slow
def test_a_draft_moved_to_another_vendor_does_not_send_its_key_to_the_live_versions_host(demo_server: Any) -> None:
    with two_vendors() as (old, new):
        agent = llm_agent(demo_server, old.base_url, "sk-old-aaaa1111")
        agent_version_publish(agent=agent, actor=ADMIN, via="tests")
        move_to(agent, new.base_url, NEW_KEY)  # not published
        run = live_run()

    assert run.version is not None and run.version.number == 1
    assert_failed_unsent(run, old.base_url)
    assert (old.requests, new.requests) == ([], [])


@pytest.mark.slow
def test_a_shadow_and_an_eval_of_a_version_with_another_endpoint_fail_the_same_way(demo_server: Any) -> None:
    with two_vendors() as (old, new):
        agent = llm_agent(demo_server, old.base_url, OLD_KEY)
        v1 = agent_version_publish(agent=agent, actor=ADMIN, via="tests")
        move_to(agent, new.base_url, NEW_KEY)
        agent_version_publish(agent=agent, actor=ADMIN, via="tests")
        agent.refresh_from_db()
        agent_shadow_set(agent=agent, actor=ADMIN, via="tests", version=v1, rate=1.0)
        live = live_run()
        shadow = executed(Run.objects.get(shadow_of=live))
        evaluated = executed(run_create(agent_slug="llm", query="hi", api_key=None, version=1, purpose="eval"))

    assert live.status == Run.Status.SUCCEEDED
    assert (shadow.purpose, shadow.version.number) == (Run.Purpose.SHADOW, 1)
    assert_failed_unsent(shadow, old.base_url)
    assert_failed_unsent(evaluated, old.base_url)
    assert old.requests == []
    assert keys_sent(new) == [f"Bearer {NEW_KEY}"]  # the live run's only


def test_a_key_rotated_for_the_same_endpoint_is_used_by_the_live_version(demo_server: Any) -> None:
    with two_vendors() as (old, _new):
        agent = llm_agent(demo_server, old.base_url, OLD_KEY)
        agent_version_publish(agent=agent, actor=ADMIN, via="tests")
        # The same endpoint written with a trailing slash (the client adds one anyway), and a new key for it.
        move_to(agent, old.base_url + "/", ROTATED_KEY)
        run = live_run()

    assert (run.status, run.answer) == (Run.Status.SUCCEEDED, "from the old host"), run.error_message
    assert keys_sent(old) == [f"Bearer {ROTATED_KEY}"]


def test_an_agent_without_a_key_still_runs_a_version_with_another_endpoint(demo_server: Any) -> None:
    with two_vendors() as (old, new):
        agent = llm_agent(demo_server, old.base_url, None)
        agent_version_publish(agent=agent, actor=ADMIN, via="tests")
        move_to(agent, new.base_url, None)
        run = live_run()

    assert (run.status, run.answer) == (Run.Status.SUCCEEDED, "from the old host"), run.error_message
    assert (len(old.requests), new.requests) == (1, [])


@pytest.mark.slow
def test_a_version_of_a_model_without_a_base_url_is_unaffected_by_the_agents_key(demo_server: Any) -> None:
    agent = make_agent(
        slug="llm", servers=[demo_server], provider="scripted", script=[{"content": "scripted"}], with_demo_rules=False
    )
    agent_version_publish(agent=agent, actor=ADMIN, via="tests")
    with two_vendors() as (old, new):
        agent_update(
            agent=agent,
            actor=ADMIN,
            via="tests",
            data={
                "model_provider": "openai_compatible",
                "model_id": "m",
                "model_params": {"base_url": new.base_url},
                "model_secrets": {"api_key": NEW_KEY},
            },
        )
        run = live_run()

    assert (run.status, run.answer) == (Run.Status.SUCCEEDED, "scripted"), run.error_message
    assert (old.requests, new.requests) == ([], [])
