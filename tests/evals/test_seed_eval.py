"""The shipped seed set against the demo agent: offline, with scripted model turns, and under a failure mode."""

from __future__ import annotations

from typing import Any

import pytest

from audit.models import AuditEvent
from evals.models import EvalRun
from tests.evals.conftest import company_assistant, import_seed_set, run_eval

# Marked slow: out of the fast loop (several seconds of real servers, processes or timeouts per test); the full
# suite runs it.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _by_key(eval_run: EvalRun) -> dict[str, Any]:
    return {r.case.key: r for r in eval_run.results.select_related("case")}


def test_the_seed_set_scores_as_expected_on_the_offline_demo_agent() -> None:
    company_assistant()
    import_seed_set()

    status, out, err = run_eval("company-assistant", "seed-001-tools")

    assert status == 0, out + err
    eval_run = EvalRun.objects.get()
    results = _by_key(eval_run)
    assert [c["name"] for c in results["employee-team"].called_tools] == ["search_employee"]
    assert results["employee-team"].passed
    assert sorted(c["name"] for c in results["classify-and-calculate"].called_tools) == [
        "calculate",
        "classify_request",
    ]
    assert results["classify-and-calculate"].passed
    assert results["what-can-you-do"].called_tools == [] and results["what-can-you-do"].passed
    assert results["asset-status"].passed and results["asset-status"].scores["matched"] == "expected"
    # The rules find the employee but not the team's projects: the offline agent never asks for a second tool.
    team = results["team-projects"]
    assert not team.passed
    assert (team.scores["precision"], team.scores["recall"]) == (1.0, 0.5)
    assert "tools:mismatch" in team.scores["failed_checks"]
    s = eval_run.summary
    assert (s["cases"], s["passed"], s["recall"], s["forbidden_violations"]) == (5, 4, 0.9, 0)
    assert s["model_calls"] == 5 and s["model_calls_saved"] == 0  # one offline model turn per case
    assert s["latency_p50_ms"] <= s["latency_p95_ms"]
    assert eval_run.failed_thresholds == []
    assert "████" not in err and "5/5 cases" in err
    # The cases ran as eval runs: their calls are audited under "eval", never as production traffic.
    sources = set(AuditEvent.objects.filter(action="tool.call").values_list("source", flat=True))
    assert sources == {"eval"}


def test_a_model_that_calls_a_tool_fails_the_no_tool_case_and_run_eval_exits_non_zero() -> None:
    script = [
        {"tool_calls": [{"name": "search_employee", "args": {"name": "김하늘"}}]},
        {"content": "{last_tool_result}"},
    ]
    company_assistant(slug="eager", provider="scripted", script=script, with_rules=False)
    import_seed_set(agent="eager")

    status, _out, err = run_eval("eager", "seed-001-tools")

    assert status == 1
    assert "forbidden_violations" in err
    results = _by_key(EvalRun.objects.get())
    no_tool = results["what-can-you-do"]
    assert not no_tool.passed
    assert no_tool.scores["forbidden_violations"] == 1
    assert "tools:forbidden" in no_tool.scores["failed_checks"]
    assert results["employee-team"].passed
    assert results["employee-team"].scores["model_calls"] == 2


def test_under_a_timeout_the_backup_tool_is_accepted() -> None:
    script = [
        {"tool_calls": [{"name": "get_asset_status", "args": {"asset_id": "A-1001"}}]},
        {
            "if_last_tool_result_contains": "get_asset_status_backup",
            "tool_calls": [{"name": "get_asset_status_backup", "args": {"asset_id": "A-1001"}}],
        },
        {"content": "{last_tool_result}"},
    ]
    company_assistant(slug="fallback", failure_mode="timeout", provider="scripted", script=script, with_rules=False)
    import_seed_set(agent="fallback")

    run_eval("fallback", "seed-001-tools")

    asset = _by_key(EvalRun.objects.get())["asset-status"]
    assert [c["name"] for c in asset.called_tools] == ["get_asset_status", "get_asset_status_backup"]
    assert asset.called_tools[0]["ok"] is False
    assert asset.passed
    assert asset.scores["matched"].startswith("백엔드 장애")
