"""An eval set's entry in ``import_config`` that leaves keys out keeps what the stored set holds.

Defect: importing ``{"name", "cases"}`` over a stored set cleared its agent, description, sandbox servers and
thresholds (a set with no thresholds no longer failed a deploy in ``run_eval``), and an entry with no ``cases``
deleted every case. Now a key left out of an existing set keeps the stored value, as the other sections' entries
do; a key given, ``{}`` and ``[]`` included, is applied; a new set takes the defaults. The API's ``POST`` is
documented as creating or replacing the set, and still replaces it.
"""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from agents.configuration import config_import
from agents.models import Agent
from agents.services import api_key_create
from evals.models import EvalSet

pytestmark = pytest.mark.django_db

CASES = [
    {"key": "team", "query": "김하늘 팀은?", "expected_tools": ["search_employee"]},
    {"key": "asset", "query": "A-1001 상태?", "expected_tools": ["get_asset_status"]},
]


def _full(agent: Agent) -> dict[str, Any]:
    return {
        "name": "regress",
        "description": "배포 전 회귀",
        "agent": agent.slug,
        "sandbox_servers": ["sds-company-data"],
        "thresholds": {"recall": 0.75, "forbidden_violations": 0},
        "cases": CASES,
    }


def _stored() -> tuple[str, str | None, list[str], dict[str, Any], list[str]]:
    eval_set = EvalSet.objects.select_related("agent").get(name="regress")
    return (
        eval_set.description,
        eval_set.agent.slug if eval_set.agent else None,
        eval_set.sandbox_servers,
        eval_set.thresholds,
        sorted(eval_set.cases.values_list("key", flat=True)),
    )


def _import(entry: dict[str, Any]) -> Any:
    return config_import(document={"eval_sets": [entry]}, actor="test", via="tests")


def test_an_entry_leaving_keys_out_keeps_the_stored_ones(demo_agent: Agent) -> None:
    _import(_full(demo_agent))
    full = ("배포 전 회귀", demo_agent.slug, ["sds-company-data"], {"recall": 0.75, "forbidden_violations": 0})
    assert _stored() == (*full, ["asset", "team"])

    report = _import({"name": "regress", "cases": CASES[:1]})
    assert _stored() == (*full, ["team"])  # the cases given apply: the one left out of them is deleted
    assert report.deleted == ["eval case regress.asset"]

    report = _import({"name": "regress"})
    assert _stored() == (*full, ["team"])  # cases left out: every case kept
    assert report.unchanged == ["eval set regress"] and not report.deleted


def test_an_entry_giving_empty_values_clears_them(demo_agent: Agent) -> None:
    _import(_full(demo_agent))
    _import({"name": "regress", "thresholds": {}, "agent": None, "description": "", "cases": []})
    assert _stored() == ("", None, ["sds-company-data"], {}, [])


def test_a_new_set_takes_the_defaults() -> None:
    _import({"name": "regress"})
    assert _stored() == ("", None, [], {}, [])


def test_the_apis_post_still_replaces_the_set(demo_agent: Agent) -> None:
    _import(_full(demo_agent))
    _key, raw = api_key_create(actor="test", via="tests", name="ops", admin=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = client.post("/api/v1/evals/sets", {"name": "regress", "cases": CASES[:1]}, format="json")
    assert response.status_code == 200, response.content
    assert _stored() == ("", None, [], {}, ["team"])
