"""A run cancelled while its worker holds it reads ``cancelled`` at once, while its worker finishes the call under way
and then records the run's end: ``?wait`` answered 200 ("finished within wait") with its trace still incomplete, and
the admin's run page stopped following it at the cancel. Both now wait for the worker's record (202; the page keeps
its stream). Also: ``?wait`` over a fractional maximum named the maximum rounded down."""

from __future__ import annotations

import re
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from agents.models import Run, RunEvent
from agents.run_state import RunEventWriter
from agents.services import run_cancel


def held(run: Run) -> None:
    """The run as a worker's claim leaves it: running, leased, its pass started now."""
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.RUNNING,
        lease_expires_at=now + timedelta(seconds=60),
        pass_started_at=now,
        worker="w1",
        delivery_count=1,
    )
    RunEventWriter(run_id=run.pk, secrets=[]).emit("status", {"status": "running"})


@pytest.mark.django_db
def test_the_run_page_keeps_following_a_run_cancelled_while_its_worker_holds_it(admin_client, demo_agent) -> None:
    run = Run.objects.create(agent=demo_agent, query="q")
    held(run)
    run_cancel(run=Run.objects.get(pk=run.pk), actor="admin:x")
    html = admin_client.get(f"/admin/agents/run/{run.pk}/change/").content.decode()
    [live] = re.findall(r'<div id="run-live"[^>]*>', html)
    assert 'data-finished="false"' in live, live

    RunEventWriter(run_id=run.pk, secrets=[]).emit_cancelled()  # its worker records the end
    html = admin_client.get(f"/admin/agents/run/{run.pk}/change/").content.decode()
    [live] = re.findall(r'<div id="run-live"[^>]*>', html)
    assert 'data-finished="true"' in live, live


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_wait_answers_202_for_a_run_cancelled_while_its_worker_holds_it(settings, demo_agent, api_client) -> None:
    settings.PLATFORM_RUN_WAKEUP = "poll"

    def worker_then_cancel() -> None:
        try:
            for _ in range(200):
                run = Run.objects.order_by("-created_at").first()
                if run is not None:
                    break
                time.sleep(0.01)
            assert run is not None
            held(run)
            time.sleep(0.2)
            run_cancel(run=Run.objects.get(pk=run.pk), actor="t", source="api")
        finally:
            connection.close()

    thread = threading.Thread(target=worker_then_cancel)
    thread.start()
    answered = api_client.post("/api/v1/runs?wait=3", {"agent": demo_agent.slug, "query": "q"}, format="json")
    thread.join()
    assert (answered.status_code, answered.json()["status"]) == (202, "cancelled")
    assert not RunEvent.objects.filter(run_id=answered.json()["id"], data__status="cancelled").exists()


@pytest.mark.django_db
def test_a_wait_over_a_fractional_maximum_names_the_maximum_as_set(settings, demo_agent, api_client) -> None:
    settings.PLATFORM_API_MAX_WAIT_S = 2.5
    refused = api_client.post("/api/v1/runs?wait=2.6", {"agent": demo_agent.slug, "query": "q"}, format="json")
    error = refused.json()["error"]
    assert refused.status_code == 400
    assert "between 0 and 2.5 seconds" in error["message"]
    assert error["fields"]["wait"] == ["A number of seconds from 0 to 2.5, such as 1.25."]
