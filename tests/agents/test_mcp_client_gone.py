"""An MCP client that goes away cancels the run its own call made, never another call's.

Two clients without a session (plain JSON callers, or a client that sends id 1 every time) under one API key make
calls with the same request id, so the same idempotency key; the client going away used to look its run up by that
key and cancel the latest one: the other client's, leaving its own to run for nobody. A ``notifications/cancelled``
still finds its run by the request id, the only thing it names.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import Client
from django.utils import timezone

from agents.api import mcp_server
from agents.models import Agent, Run
from audit.models import AuditEvent
from tests.api.test_protocol_endpoints import mcp_post_scope
from tests.conftest import ApiCaller, make_agent

CALL = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "ask_quiet", "arguments": {"query": "q"}}}


@pytest.fixture
def quiet(db: Any) -> Agent:
    """An agent without servers or rules: its runs stay queued (no worker runs in these tests)."""
    return make_agent(slug="quiet", servers=[], with_demo_rules=False)


def sessionless_call(raw_key: str, accept: str) -> Any:
    """A ``tools/call`` with id 1 and no ``Mcp-Session-Id``, its answer left open (the run stays queued)."""
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client.post("/mcp/", json.dumps(CALL), content_type="application/json", headers={"Accept": accept})


def made_earlier(run: Run) -> None:
    """Set a run's creation apart from the next one's (the lookup by request id takes the latest)."""
    Run.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(seconds=5))


@pytest.mark.django_db
@pytest.mark.parametrize("accept", ["application/json", "application/json, text/event-stream"])
def test_a_sessionless_client_that_goes_away_cancels_its_own_run_not_the_other_clients(
    api_caller: ApiCaller, quiet: Agent, settings: Any, accept: str
) -> None:
    settings.PLATFORM_SSE_POLL_S = 0.01
    settings.PLATFORM_SSE_KEEPALIVE_S = 0  # the stream's first poll sends something: the answer has begun
    first = sessionless_call(api_caller.raw_key, accept)
    answer = first._iterator  # the test client's wrapper: closing it closes the response, as a server does
    next(answer)
    mine = Run.objects.get()
    made_earlier(mine)
    sessionless_call(api_caller.raw_key, accept)  # another client, the same key, the same id 1
    theirs = Run.objects.exclude(pk=mine.pk).get()
    answer.close()  # the first client goes away
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert (mine.status, theirs.status) == (Run.Status.CANCELLED, Run.Status.QUEUED)
    # Recorded as before: the key's own cancel through the API, the client gone as its reason.
    actor = f"api_key:{api_caller.key.prefix} (client gone)"
    assert (mine.error_code, mine.error_message) == ("cancelled", f"cancelled by {actor}")
    event = AuditEvent.objects.get(action="run.cancel")
    assert (event.run_id, event.source, event.actor) == (mine.pk, "api", actor)


@pytest.mark.django_db(transaction=True)
def test_a_sessionless_client_that_goes_away_while_its_run_is_made_cancels_that_run(
    api_caller: ApiCaller, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client leaves while its call is still making its run, and meanwhile another client's call with the same
    id has made its own: the run made for the call that was left is the one cancelled."""
    settings.PLATFORM_SSE_POLL_S = 0.05
    make_agent(slug="quiet", servers=[], with_demo_rules=False)
    gone = threading.Event()
    real_create = mcp_server.run_create

    def create_then_find_the_client_gone(**kwargs: Any) -> Any:
        run = real_create(**kwargs)
        made_earlier(run)
        real_create(**kwargs)  # another client's call with the same id (and key), made meanwhile
        assert gone.wait(10)  # the client leaves before the call has returned its run
        time.sleep(0.2)  # and Django has cancelled the view meanwhile
        return run

    monkeypatch.setattr(mcp_server, "run_create", create_then_find_the_client_gone)
    body = json.dumps(CALL).encode()
    scope = mcp_post_scope(body, raw_key=api_caller.raw_key, accept="application/json, text/event-stream")
    taken = False

    async def receive() -> dict[str, Any]:
        nonlocal taken
        if not taken:
            taken = True
            return {"type": "http.request", "body": body, "more_body": False}
        while await sync_to_async(Run.objects.count, thread_sensitive=False)() < 2:
            await asyncio.sleep(0.01)
        gone.set()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        pass

    from agent_platform.asgi import application

    asyncio.run(asyncio.wait_for(application(scope, receive, send), timeout=30))
    mine, theirs = Run.objects.order_by("created_at")
    assert (mine.status, theirs.status) == (Run.Status.CANCELLED, Run.Status.QUEUED)
    assert mine.error_message == f"cancelled by api_key:{api_caller.key.prefix} (client gone)"


@pytest.mark.django_db
def test_a_cancelled_notification_still_finds_its_call_by_request_id_within_the_session(
    api_caller: ApiCaller, quiet: Agent
) -> None:
    """The notification names only a request id: its own session's call (the session is part of the call's id),
    and without a session the latest call with that id (the two cannot be told apart)."""
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_caller.raw_key}")

    def post(body: dict[str, Any], **headers: str) -> Any:
        headers = {"Accept": "application/json", **headers}
        return client.post("/mcp/", json.dumps(body), content_type="application/json", headers=headers)

    post(CALL, **{"Mcp-Session-Id": "s-1"})
    in_session = Run.objects.get()
    made_earlier(in_session)
    post(CALL)
    sessionless = Run.objects.exclude(pk=in_session.pk).get()
    cancelled = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}
    assert post(cancelled, **{"Mcp-Session-Id": "s-1"}).status_code == 202
    in_session.refresh_from_db()
    sessionless.refresh_from_db()
    assert (in_session.status, sessionless.status) == (Run.Status.CANCELLED, Run.Status.QUEUED)
    assert in_session.error_message == f"cancelled by api_key:{api_caller.key.prefix} (cancelled)"
