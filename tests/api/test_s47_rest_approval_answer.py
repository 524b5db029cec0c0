"""The answer to ``POST /runs/{id}/approvals/{approval_id}`` is the approval as ``GET /runs/{id}`` shows it: masked
again with the credentials bound now (``MaskedAsServed``). The run is real (the probe server over stdio, a
scripted model that calls ``append_note`` with a token the user typed, parked for approval); only then is the
token bound as another server's secret, so the approval's stored arguments hold it in clear."""

from __future__ import annotations

from typing import Any

import pytest

from audit.masking import MASK
from tests.agents.test_approvals import eager_tasks, park  # noqa: F401
from tests.agents.test_s47_remask_shown import TOKEN, bind_later, parked  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def test_the_decisions_answer_masks_a_token_bound_after_the_approval_was_recorded(
    parked: Any,  # noqa: F811 - the fixture
) -> None:
    run, approval, client, _raw = parked
    bind_later()

    shown = client.get(f"/api/v1/runs/{run.pk}").json()["approvals"][0]
    response = client.post(
        f"/api/v1/runs/{run.pk}/approvals/{approval.pk}", {"decision": "reject", "reason": "아니요"}, format="json"
    )

    assert response.status_code == 200, response.content
    assert TOKEN not in response.content.decode()
    assert response.json()["args"] == shown["args"] == {"text": f"메모 {MASK}"}
    assert (response.json()["status"], response.json()["reason"]) == ("rejected", "아니요")
