"""Evals of an agent whose stored secrets this process cannot decrypt (its model key or a bound server's env,
stored with a key ``SECRETS_ENCRYPTION_KEYS`` lacks).

1. Starting such an eval is refused as a run submission is: a 503 ``config:secret_unreadable``, nothing created.
2. A key lost after the eval started: its remaining cases are scored as not submitted with that reason, and the eval
   run ends; the background pass goes on to the other eval runs.
3. One eval run the background pass cannot refresh at all is logged with its id, and the pass goes on.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from rest_framework.test import APIClient

from agent_platform.errors import ApplicationError
from agents.execution import run_execute
from agents.models import Agent, Run
from agents.services import api_key_create
from evals.models import EvalCaseResult, EvalRun, EvalSet
from evals.services import eval_run_start, eval_runs_refresh_open
from mcpregistry.models import McpServer
from tests.agents.test_poisoned_runs import poison_agent, store_corrupt, store_foreign
from tests.evals.conftest import company_assistant, import_seed_set

UNREADABLE = "config:secret_unreadable"
NOT_SUBMITTED = f"eval:not_submitted:{UNREADABLE}"


@pytest.fixture
def admin_key_client(db: Any) -> APIClient:
    _key, raw = api_key_create(actor="test", via="tests", name="ops", admin=True)
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _poison_server(agent: Agent) -> None:
    server = agent.servers.exclude(transport=McpServer.Transport.LOCAL).get()
    store_foreign(McpServer, "env", server.pk, {"API_TOKEN": {"value": "tok-foreign-000000000000"}})


def _eval_runs_of(agent: Agent) -> int:
    return EvalRun.objects.filter(agent=agent).count()


# ---- 1. starting an eval ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize("poison", [poison_agent, _poison_server], ids=["model_key", "server_env"])
def test_starting_an_eval_whose_secrets_cannot_be_decrypted_is_a_503_not_a_500(
    admin_key_client: APIClient, poison: Any
) -> None:
    agent = company_assistant()
    import_seed_set()
    poison(agent)

    response = admin_key_client.post("/api/v1/evals/runs", {"set": "seed-001-tools"}, format="json")

    assert response.status_code == 503, response.content
    error = response.json()["error"]
    assert error["code"] == UNREADABLE and "SECRETS_ENCRYPTION_KEYS" in error["message"]
    assert "foreign" not in response.content.decode()  # the answer holds no secret
    assert int(response["Retry-After"]) > 0
    # Refused as a whole: no eval run, no version frozen for it, no run.
    assert _eval_runs_of(agent) == 0 and not Run.objects.filter(agent=agent).exists()


@pytest.mark.slow
@pytest.mark.django_db
def test_the_service_refuses_it_with_the_same_application_error() -> None:
    """What ``run_eval`` and the admin action call: they answer an ApplicationError in words, as any refusal."""
    agent = company_assistant()
    eval_set = import_seed_set()
    poison_agent(agent)

    with pytest.raises(ApplicationError) as refused:
        eval_run_start(eval_set=eval_set, agent=agent, actor="admin")

    assert (refused.value.code, refused.value.status) == (UNREADABLE, 503)
    assert _eval_runs_of(agent) == 0


# ---- 2. a key lost while the eval runs --------------------------------------------------------------------------


def _two_eval_runs() -> tuple[EvalRun, EvalRun]:
    """A healthy agent's eval run, then another agent's, one case of each in flight."""
    agent = company_assistant()
    eval_set: EvalSet = import_seed_set()
    healthy = eval_run_start(eval_set=eval_set, agent=agent, actor="admin", window=1)
    other = company_assistant(slug="other-assistant")
    return healthy, eval_run_start(eval_set=eval_set, agent=other, actor="admin", window=1)


def _in_flight(eval_run: EvalRun) -> list[Run]:
    return list(Run.objects.filter(eval_results__eval_run=eval_run, status=Run.Status.QUEUED))


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_key_lost_after_the_start_ends_that_eval_run_and_the_others_go_on() -> None:
    healthy, poisoned = _two_eval_runs()
    for run in [*_in_flight(healthy), *_in_flight(poisoned)]:
        run_execute(run_id=str(run.id))
    poison_agent(poisoned.agent)

    eval_runs_refresh_open()  # raised SecretDecryptionError: every pass, for ever

    # The healthy eval run's finished case is scored and its next one submitted.
    healthy.refresh_from_db()
    assert healthy.done == 1 and len(_in_flight(healthy)) == 1
    # The other one's remaining cases are scored as not submitted, with the reason, a window at a time, and it ends.
    for _pass in range(poisoned.total):
        eval_runs_refresh_open()
    poisoned.refresh_from_db()
    assert (poisoned.status, poisoned.done) == (EvalRun.Status.FINISHED, poisoned.total)
    refused = EvalCaseResult.objects.filter(eval_run=poisoned, run__isnull=True)
    assert refused.count() == poisoned.total - 1
    for result in refused:
        assert result.scored and not result.passed
        assert NOT_SUBMITTED in result.scores["failed_checks"]
        assert "SECRETS_ENCRYPTION_KEYS" in result.answer and "foreign" not in result.answer
    assert not Run.objects.filter(agent=poisoned.agent, status=Run.Status.QUEUED).exists()


# ---- 3. one eval run that cannot be refreshed at all ------------------------------------------------------------


@pytest.mark.slow  # ≥ 1.5 s: the fast loop stays under five minutes
@pytest.mark.django_db(transaction=True)
def test_an_eval_run_that_cannot_be_refreshed_is_logged_by_id_and_the_pass_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    healthy, broken = _two_eval_runs()
    run_execute(run_id=str(_in_flight(healthy)[0].id))
    # A row written by hand (JSON in clear, no token): the agent cannot be loaded at all, its eval run not refreshed.
    store_corrupt(Agent, "model_secrets", broken.agent_id)

    with caplog.at_level(logging.ERROR):
        assert eval_runs_refresh_open() == 0

    healthy.refresh_from_db()
    assert healthy.done == 1 and len(_in_flight(healthy)) == 1
    assert str(broken.pk) in caplog.text and "the pass goes on" in caplog.text
    assert "메모" not in caplog.text  # the stored value is not logged
    assert EvalRun.objects.get(pk=broken.pk).status == EvalRun.Status.RUNNING  # left for a later pass
