"""An admin key scoped to agents (``ApiKey.agents``) runs evals against those agents only and reads only their
eval runs: any other agent, and any eval run against one, is a 404 as ``POST /runs`` answers, so the key learns
nothing of them. A key not scoped to agents reaches every agent."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from agents.models import Agent
from agents.services import api_key_create
from evals.models import EvalCaseResult, EvalRun, EvalSet
from evals.services import eval_case_create, eval_set_create

pytestmark = pytest.mark.django_db


def _client(*, agents: list[Agent]) -> APIClient:
    _key, raw = api_key_create(actor="test", via="tests", name="ops", admin=True, agents=agents)
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.fixture
def world(db: Any) -> dict[str, Any]:
    mine = Agent.objects.create(slug="mine", name="mine")
    theirs = Agent.objects.create(slug="theirs", name="theirs")
    eval_set = eval_set_create(actor="test", via="tests", data={"name": "s", "agent": theirs})
    case = eval_case_create(actor="test", via="tests", data={"eval_set": eval_set, "key": "k", "query": "질문"})
    shared = eval_set_create(actor="test", via="tests", data={"name": "shared"})  # no agent of its own
    shared_case = eval_case_create(
        actor="test", via="tests", data={"eval_set": shared, "key": "k", "query": "공용 질문"}
    )
    runs = {}
    for agent, of_set, with_case in ((mine, shared, shared_case), (theirs, eval_set, case)):
        runs[agent.slug] = EvalRun.objects.create(eval_set=of_set, agent=agent, total=1)
        EvalCaseResult.objects.create(eval_run=runs[agent.slug], case=with_case)
    return {"mine": mine, "theirs": theirs, "set": eval_set, "runs": runs}


def test_a_scoped_key_cannot_start_an_eval_against_another_agent(world: dict[str, Any]) -> None:
    client = _client(agents=[world["mine"]])
    named = client.post("/api/v1/evals/runs", {"set": "shared", "agent": "theirs"}, format="json")
    assert named.status_code == 404 and named.json()["error"]["code"] == "agent_not_found"
    # A set whose own agent is out of the scope is not the key's (not even against its own agent).
    by_default = client.post("/api/v1/evals/runs", {"set": "s"}, format="json")
    assert by_default.status_code == 404 and by_default.json()["error"]["code"] == "not_found"
    assert client.post("/api/v1/evals/runs", {"set": "s", "agent": "mine"}, format="json").status_code == 404
    assert EvalRun.objects.filter(agent=world["theirs"]).count() == 1  # the fixture's only
    started = client.post("/api/v1/evals/runs", {"set": "shared", "agent": "mine"}, format="json")
    assert started.status_code == 202, started.content


def test_a_scoped_key_reads_only_the_eval_runs_of_its_agents(world: dict[str, Any]) -> None:
    client = _client(agents=[world["mine"]])
    mine, theirs = world["runs"]["mine"], world["runs"]["theirs"]
    assert client.get(f"/api/v1/evals/runs/{mine.pk}").status_code == 200
    hidden = client.get(f"/api/v1/evals/runs/{theirs.pk}")
    assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "not_found"
    assert client.get(f"/api/v1/evals/runs/{mine.pk}/compare/{theirs.pk}").status_code == 404
    listed = client.get("/api/v1/evals/runs")
    assert [r["id"] for r in listed.json()["results"]] == [str(mine.pk)]
    assert client.get("/api/v1/evals/runs", {"agent": "theirs"}).status_code == 404


def test_a_scoped_key_cannot_point_a_set_at_another_agent(world: dict[str, Any]) -> None:
    client = _client(agents=[world["mine"]])
    refused = client.post("/api/v1/evals/sets", {"name": "new", "agent": "theirs", "cases": []}, format="json")
    assert refused.status_code == 400 and "agent: unknown agent 'theirs'" in refused.json()["error"]["message"]
    assert not EvalSet.objects.filter(name="new").exists()
    assert client.post("/api/v1/evals/sets", {"name": "new", "agent": "mine"}, format="json").status_code == 201


def test_a_key_not_scoped_to_agents_reaches_every_agent(world: dict[str, Any]) -> None:
    client = _client(agents=[])
    theirs = world["runs"]["theirs"]
    assert client.get(f"/api/v1/evals/runs/{theirs.pk}").status_code == 200
    assert len(client.get("/api/v1/evals/runs").json()["results"]) == 2
    assert client.post("/api/v1/evals/runs", {"set": "s"}, format="json").status_code == 202


def test_a_scoped_key_reads_and_replaces_only_the_sets_of_its_agents_or_of_none(world: dict[str, Any]) -> None:
    client = _client(agents=[world["mine"]])
    listed = client.get("/api/v1/evals/sets").json()["results"]
    assert [s["name"] for s in listed] == ["shared"]
    assert client.get("/api/v1/evals/sets/s").status_code == 404
    assert client.get("/api/v1/evals/sets/shared").status_code == 200
    # Another agent's set is neither re-pointed nor rewritten by a document of the same name.
    replaced = client.post(
        "/api/v1/evals/sets",
        {"name": "s", "agent": "mine", "cases": [{"key": "k", "query": "바뀐 질문"}]},
        format="json",
    )
    assert replaced.status_code == 404
    kept = EvalSet.objects.get(name="s")
    assert kept.agent == world["theirs"] and kept.cases.get().query == "질문"
    # A key for every agent sees them all.
    assert len(_client(agents=[]).get("/api/v1/evals/sets").json()["results"]) == 2


def test_a_scoped_key_cannot_read_another_agents_set_through_an_eval_run(world: dict[str, Any]) -> None:
    """An unscoped admin ran agent y's set against agent x: a key scoped to x was refused the set (404) but read
    its questions in the eval run (200)."""
    ys = eval_set_create(actor="test", via="tests", data={"name": "ys", "agent": world["theirs"]})
    secret = eval_case_create(actor="test", via="tests", data={"eval_set": ys, "key": "k", "query": "Y의 비밀 질문"})
    across = EvalRun.objects.create(eval_set=ys, agent=world["mine"], total=1)
    EvalCaseResult.objects.create(eval_run=across, case=secret)
    client = _client(agents=[world["mine"]])
    assert client.get("/api/v1/evals/sets/ys").status_code == 404
    hidden = client.get(f"/api/v1/evals/runs/{across.pk}")
    assert hidden.status_code == 404 and "Y의 비밀 질문" not in hidden.content.decode()
    listed = client.get("/api/v1/evals/runs").json()["results"]
    assert str(across.pk) not in [r["id"] for r in listed] and listed
    mine = world["runs"]["mine"]
    assert client.get(f"/api/v1/evals/runs/{mine.pk}/compare/{across.pk}").status_code == 404
    assert client.get(f"/api/v1/evals/runs/{across.pk}/compare/{mine.pk}").status_code == 404
    assert _client(agents=[]).get(f"/api/v1/evals/runs/{across.pk}").status_code == 200  # unscoped: every set
