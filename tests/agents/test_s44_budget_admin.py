"""The budget admin after a review in Chromium: its days and months say they are UTC ones; a budget switched off
shows its period's spend from its runs (its counters stopped when it was switched off); a revoked API key is not
offered and is refused; the reservation and cost inputs hold what they are given; and a run's page shows its
error message in the reader's language, as its timeline does."""

from __future__ import annotations

import datetime as dt
import html
import re
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agents.budgets import budget_create, budget_update
from agents.models import Agent, ApiKey, Budget, Run
from agents.services import api_key_revoke
from tests.conftest import ApiCaller

pytestmark = pytest.mark.django_db

ADD = "/admin/agents/budget/add/"


def _form(key: ApiKey, **changes: Any) -> dict[str, Any]:
    form = {"api_key": key.pk, "agent": "", "period": "day", "max_tokens": "1000", "max_cost": ""}
    return {**form, "run_reservation_tokens": "500", "enabled": "on", **changes}


def _input(page: str, name: str) -> str:
    found = re.search(rf'<input [^>]*name="{name}"[^>]*>', page)
    assert found is not None, name
    return found.group(0)


def test_the_budget_form_and_list_say_a_period_is_a_utc_one(admin_client: Client, api_caller: ApiCaller) -> None:
    page = admin_client.get(ADD, HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert "A UTC day or month: a day starts at 00:00 UTC (09:00 in Seoul)." in page
    budget_create(actor="test", via="tests", data={"api_key": api_caller.key, "period": "day", "max_tokens": 100_000})
    listed = html.unescape(admin_client.get("/admin/agents/budget/", HTTP_ACCEPT_LANGUAGE="en").content.decode())
    assert re.search(r"column-period_utc.*?Period \(UTC\)", listed, re.S)  # the column
    assert "By period (UTC)" in listed  # the filter
    assert '<td class="field-period_utc">day</td>' in listed


def test_a_budget_switched_off_shows_its_runs_spend_this_period_not_its_stopped_counters(
    admin_client: Client, api_caller: ApiCaller
) -> None:
    agent = Agent.objects.create(slug="spender", name="spender")

    def spent(tokens: int, cost_micros: int) -> Run:
        return Run.objects.create(
            agent=agent,
            api_key=api_caller.key,
            query="q",
            status=Run.Status.SUCCEEDED,
            tokens=tokens,
            cost_micros=cost_micros,
        )

    spent(29, 1_000)
    data = {"api_key": api_caller.key, "period": "day", "max_tokens": 100_000, "run_reservation_tokens": 100}
    budget = budget_create(actor="test", via="tests", data=data)  # its counters open with the 29 spent today
    other = budget_create(actor="test", via="tests", data={"agent": agent, "period": "month", "max_tokens": 100_000})
    for switched_off in (budget, other):
        switched_off.enabled = False
        budget_update(budget=switched_off, actor="test", via="tests")
    spent(58, 2_000)
    long_ago = spent(1_000, 9)
    Run.objects.filter(pk=long_ago.pk).update(created_at=timezone.now() - dt.timedelta(days=40))

    page = html.unescape(admin_client.get("/admin/agents/budget/", HTTP_ACCEPT_LANGUAGE="en").content.decode())
    cells = re.findall(r'<td class="field-used_now">(.*?)</td>', page)
    assert cells == [
        "87 tokens, $0.003 (spent by its runs; not enforced while switched off)",
        "87 tokens, $0.003 (spent by its runs; not enforced while switched off)",
    ]


def test_the_budget_list_reads_the_spend_of_budgets_switched_off_with_the_page(admin_client: Client) -> None:
    from tests.test_admin_query_counts import counts_at_two_sizes

    def add_rows(count: int) -> None:
        for _ in range(count):
            n = Budget.objects.count()
            agent = Agent.objects.create(slug=f"agent-{n}", name="agent")
            key = ApiKey.objects.create(name=f"key {n}", prefix=f"apk_{n:04d}", digest=f"{n:064d}")
            Run.objects.create(agent=agent, api_key=key, query="q", status=Run.Status.SUCCEEDED, tokens=7 + n)
            for owner in ({"agent": agent}, {"api_key": key}):
                data = {**owner, "period": ["day", "month"][n % 2], "max_tokens": 100_000, "enabled": False}
                budget_create(actor="test", via="tests", data=data)

    few, many = counts_at_two_sizes(admin_client, "/admin/agents/budget/", add_rows)
    assert few == many
    page = admin_client.get("/admin/agents/budget/").content.decode()
    used = re.findall(r'<td class="field-used_now">(\d+) tokens, ', page)
    assert sorted(used) == sorted(str(7 + n) for n in range(0, 40, 2) for _owner in range(2))


def test_a_revoked_key_is_not_offered_for_a_budget_and_is_refused_when_posted(
    admin_client: Client, api_caller: ApiCaller, other_caller: ApiCaller
) -> None:
    budget = budget_create(actor="test", via="tests", data={"api_key": other_caller.key, "max_tokens": 100_000})
    api_key_revoke(api_key=other_caller.key, actor="test", via="tests")
    page = admin_client.get(ADD).content.decode()
    offered = re.findall(r'<option value="(\d+)"', page[page.index('name="api_key"') :].split("</select>")[0])
    assert offered == [str(api_caller.key.pk)]

    refused = admin_client.post(ADD, _form(other_caller.key), HTTP_ACCEPT_LANGUAGE="en")
    assert refused.status_code == 200
    errors = refused.context["adminform"].form.errors
    assert errors["api_key"] == [
        f"API key {other_caller.key} is revoked: a budget on it would limit nothing. Choose a key in use."
    ]
    assert Budget.objects.count() == 1
    # The budget stored on it before it was revoked is still shown.
    assert admin_client.get(f"/admin/agents/budget/{budget.pk}/change/").status_code == 200
    assert admin_client.post(ADD, _form(api_caller.key)).status_code == 302


def test_the_reservations_input_is_as_wide_as_the_token_limits(admin_client: Client) -> None:
    page = admin_client.get(ADD).content.decode()
    reservation = _input(page, "run_reservation_tokens")
    assert 'class="vBigIntegerField"' in reservation and 'value="20000"' in reservation
    assert 'class="vBigIntegerField"' in _input(page, "max_tokens")


def test_the_cost_limit_is_a_text_input_and_a_decimal_comma_is_refused_with_a_hint(
    admin_client: Client, api_caller: ApiCaller
) -> None:
    page = admin_client.get(ADD).content.decode()
    cost = _input(page, "max_cost")
    assert 'type="text"' in cost and 'inputmode="decimal"' in cost

    refused = admin_client.post(ADD, _form(api_caller.key, max_tokens="", max_cost="1,5"), HTTP_ACCEPT_LANGUAGE="en")
    assert refused.context["adminform"].form.errors["max_cost"] == [
        "Enter a number in US dollars with a dot for cents: 1.5, not 1,5."
    ]
    assert not Budget.objects.exists()
    assert admin_client.post(ADD, _form(api_caller.key, max_tokens="", max_cost="1.5")).status_code == 302
    assert Budget.objects.get().max_cost == 1.5
    stored = admin_client.get(f"/admin/agents/budget/{Budget.objects.get().pk}/change/").content.decode()
    assert 'value="1.5000"' in _input(stored, "max_cost")


def test_a_runs_page_shows_its_error_message_in_the_readers_language(admin_client: Client) -> None:
    agent = Agent.objects.create(slug="loops", name="loops")
    stored = "the agent did not finish within 1 iterations"
    run = Run.objects.create(
        agent=agent, query="q", status=Run.Status.FAILED, error_code="max_iterations", error_message=stored
    )
    for language, words in (("ko", "에이전트가 1번 반복 안에 끝내지 못함"), ("en", stored)):
        admin_client.cookies["django_language"] = language
        page = html.unescape(admin_client.get(f"/admin/agents/run/{run.pk}/change/").content.decode())
        field = re.search(r'field-error_message\w*">.*?<div class="readonly">(.*?)</div>', page, re.S)
        assert field is not None and field.group(1) == words
        if language == "ko":
            assert stored not in page
