"""The admin: a set edited through the services (audited), run from an action, an eval run's page with its
progress, and two eval runs side by side with the cases that changed outcome first."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from agents.models import DeterministicRule, Run
from agents.services import deterministic_rule_update
from audit.models import AuditEvent
from evals.models import EvalRun, EvalSet
from evals.services import eval_run_compare
from tests.evals.conftest import company_assistant, import_seed_set, run_eval

# Marked slow: out of the fast loop (several seconds of real servers, processes or timeouts per test); the full
# suite runs it.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_an_admin_edit_of_a_set_goes_through_the_services(admin_client: Client) -> None:
    company_assistant()
    eval_set = import_seed_set()
    url = reverse("admin:evals_evalset_change", args=[eval_set.pk])
    page = admin_client.get(url)
    assert page.status_code == 200
    form = page.context["adminform"].form
    data = {
        "name": eval_set.name,
        "description": "changed by an admin",
        "agent": form.initial["agent"],
        "thresholds": '{"recall": 0.9}',
    }
    formset = page.context["inline_admin_formsets"][0].formset
    data.update({f"{formset.prefix}-TOTAL_FORMS": "0", f"{formset.prefix}-INITIAL_FORMS": "0"})
    # Keep the existing cases: post them back as they are.
    data[f"{formset.prefix}-TOTAL_FORMS"] = str(len(formset.forms))
    data[f"{formset.prefix}-INITIAL_FORMS"] = str(len(formset.forms))
    for i, case_form in enumerate(formset.forms):
        for name, field in case_form.fields.items():
            value = case_form.initial.get(name, field.initial)
            if name == "id":
                value = case_form.instance.pk
            if name == "eval_set":
                value = eval_set.pk
            if value is None:
                continue
            if isinstance(value, list | dict):
                value = json.dumps(value, ensure_ascii=False)
            if isinstance(value, bool):
                if not value:
                    continue
                value = "on"
            data[f"{formset.prefix}-{i}-{name}"] = value
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else ""
    eval_set.refresh_from_db()
    assert eval_set.thresholds == {"recall": 0.9}
    event = AuditEvent.objects.filter(action="config.eval_set.update").latest("id")
    assert event.actor == "admin" and event.result["via"] == "admin"
    assert event.args["thresholds"][1] == {"recall": 0.9}


def test_the_run_action_starts_an_eval_run_and_its_page_shows_progress(admin_client: Client) -> None:
    company_assistant()
    eval_set = import_seed_set()
    response = admin_client.post(
        reverse("admin:evals_evalset_changelist"),
        {"action": "run_against_agent", "_selected_action": [eval_set.pk]},
    )
    eval_run = EvalRun.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:evals_evalrun_change", args=[eval_run.pk])
    page = admin_client.get(response["Location"]).content.decode()
    assert "0 of 5 cases scored" in page and 'http-equiv="refresh"' in page
    from agents.execution import run_execute

    first = Run.objects.filter(eval_results__eval_run=eval_run).order_by("created_at").first()
    assert first is not None and first.purpose == "eval"
    run_execute(run_id=str(first.id))
    assert "1 of 5 cases scored" in admin_client.get(response["Location"]).content.decode()


def test_two_eval_runs_side_by_side_put_the_changed_cases_first(admin_client: Client) -> None:
    agent = company_assistant()
    import_seed_set()
    assert run_eval("company-assistant", "seed-001-tools", "--label", "before")[0] == 0
    # An admin disables the rule that finds an employee: two cases change outcome.
    rule = DeterministicRule.objects.get(agent=agent, name="직원 소속 조회")
    deterministic_rule_update(rule=rule, actor="admin", via="tests", data={"enabled": False})
    status, _out, err = run_eval("company-assistant", "seed-001-tools", "--label", "after")
    assert status == 1 and "recall" in err  # below the set's recall threshold: the deploy gate closes
    before, after = EvalRun.objects.order_by("created_at")

    rows = eval_run_compare(a=before, b=after)
    assert [(r.case.key, r.changed) for r in rows][:2] == [("employee-team", True), ("team-projects", True)]
    assert not any(r.changed for r in rows[2:])

    url = reverse("admin:evals_evalrun_changelist")
    response = admin_client.post(url, {"action": "compare", "_selected_action": [before.pk, after.pk]})
    assert response.status_code == 302
    page = admin_client.get(response["Location"]).content.decode()
    assert "2 cases changed (passed or failed, or called other tools)" in page
    assert page.index("employee-team") < page.index("team-projects") < page.index("classify-and-calculate")
    assert "before" in page and "after" in page
    finished = admin_client.get(reverse("admin:evals_evalrun_change", args=[after.pk])).content.decode()
    assert "5 of 5 cases scored" in finished and 'http-equiv="refresh"' not in finished
    assert "Thresholds not met" in finished and "recall 0.6 &lt; 0.75" in finished
    # Each case's own scores: the employee case called no expected tool (recall 0) and took some milliseconds.
    assert "tool precision" in finished and "tool recall" in finished
    row = finished[finished.index("<td>employee-team</td>") :]
    row = row[: row.index("</tr>")]
    assert "<td>0.00</td>" in row and " ms</td>" in row


def test_an_outsider_cannot_see_eval_runs(outsider_client: Client, admin_client: Client) -> None:
    assert outsider_client.get(reverse("admin:evals_evalrun_changelist")).status_code == 403
    assert outsider_client.get(reverse("admin:evals_evalrun_compare") + "?a=x&b=y").status_code == 403
    assert EvalSet.objects.count() == 0


def test_run_eval_runs_the_published_version_it_names_and_refuses_an_unknown_one(admin_client: Any) -> None:
    from agents.services import agent_version_publish

    agent = company_assistant()
    import_seed_set()
    status, _out, err = run_eval("company-assistant", "seed-001-tools", "--version", "3")
    assert status == 1 and "has no version 3" in err
    assert not EvalRun.objects.exists()
    first = agent_version_publish(agent=agent, actor="admin", via="tests")
    # The next version loses the rule that finds an employee; it goes live.
    rule = DeterministicRule.objects.get(agent=agent, name="직원 소속 조회")
    deterministic_rule_update(rule=rule, actor="admin", via="tests", data={"enabled": False})
    agent.refresh_from_db()
    second = agent_version_publish(agent=agent, actor="admin", via="tests")
    assert second.number == first.number + 1

    assert run_eval("company-assistant", "seed-001-tools", "--version", str(first.number), "--label", "v1")[0] == 0
    assert run_eval("company-assistant", "seed-001-tools", "--label", "live")[0] == 1  # the live v2 misses
    pinned, live = EvalRun.objects.order_by("created_at")
    assert pinned.version == first.number
    assert {r.version_id for r in Run.objects.filter(eval_results__eval_run=pinned)} == {first.pk}
    assert {r.version_id for r in Run.objects.filter(eval_results__eval_run=live)} == {second.pk}
    changed = [r.case.key for r in eval_run_compare(a=pinned, b=live) if r.changed]
    assert changed == ["employee-team", "team-projects"]
