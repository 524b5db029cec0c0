"""Property: a secret bound to the platform survives in none of its outputs — the audit row, the gate's
result and message, the run's trace and answer, the API's view of the run, and the log."""

from __future__ import annotations

import itertools
import json
import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from agents.execution import run_execute
from agents.models import Run
from agents.services import api_key_create
from audit.masking import SecretMaskingFilter, register_secrets
from audit.models import AuditEvent
from tests.conftest import make_agent

EXAMPLES = itertools.count()
# A secret here has at least one character no name of the platform's has ("queue_wait_m" is a piece of the API's
# "queue_wait_ms", "agents.engine" a logger's name; Hypothesis also draws strings from the project's code):
# masking is for values, never for the names of the platform's fields, loggers or codes, so those are not drawn.
# The unit properties in test_masking.py draw secrets of every shape.
NOT_IN_NAMES = set("!#$&*+;<=>?@^`|~")
SECRETS = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="'\"\\{}%"), min_size=12, max_size=40
).filter(lambda s: not s.isdigit() and len(set(s)) > 4 and bool(NOT_IN_NAMES & set(s)))


@pytest.mark.slow
@pytest.mark.django_db
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(secret=SECRETS)
def test_no_bound_secret_survives_in_any_output(secret, demo_server, caplog) -> None:
    register_secrets([secret])  # what binding it to a server does (the gate registers its binding's secrets)
    handler_filter = SecretMaskingFilter()
    caplog.handler.addFilter(handler_filter)
    try:
        _key, raw = api_key_create(actor="test", via="tests", name="p")
        agent = make_agent(
            slug=f"property-{next(EXAMPLES)}",
            servers=[demo_server],
            provider="scripted",
            with_demo_rules=False,
            script=[
                {"tool_calls": [{"name": "search_employee", "args": {"name": secret}}]},
                {"content": "결과: {last_tool_result} / " + secret},
            ],
        )
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        with caplog.at_level(logging.DEBUG):
            logging.getLogger("tests").warning("caller sent %s", secret)
            submitted = client.post("/api/v1/runs", {"agent": agent.slug, "query": f"찾아줘 {secret}"}, format="json")
            run_execute(run_id=submitted.json()["id"])
        run = Run.objects.get(pk=submitted.json()["id"])
        api_view = submitted.content.decode() + client.get(f"/api/v1/runs/{run.id}").content.decode()
        stored = json.dumps(
            list(AuditEvent.objects.filter(run_id=run.id).values("args", "result", "reason")), ensure_ascii=False
        )
        outputs = {
            "audit": stored,
            "answer": run.answer,
            "trace": json.dumps(run.messages, ensure_ascii=False),
            "api": api_view,
            "log": caplog.text,
        }
        for where, text in outputs.items():
            at = text.find(secret)
            assert at < 0, f"{where}: …{text[max(0, at - 120) : at + 60]}…"
    finally:
        caplog.handler.removeFilter(handler_filter)
