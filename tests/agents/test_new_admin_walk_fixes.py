"""What a new admin met in their first hour (a reviewer's walk in Chromium), held here.

1. Saving a published agent, or one of its rules, with publish on save off said only "was changed successfully":
   nothing said the change is a draft that live traffic does not get until the agent is published again (the
   reviewer edited a rule, and the next API run used v1 without it). Such a save now says so; one that published
   on save keeps the messages it had.
2. The approval page, its Approve…/Reject… confirmation and the dashboard's pending approvals showed the call but
   not the question (the run's query, masked as stored) that led to it: an approver had to open the run's page,
   which not every approver may view.
3. The "API key issued" page said only "Callers send it as Authorization: Bearer …": not where to send it, what to
   send, or where the API is documented.
"""

from __future__ import annotations

import html
import json
import re

import pytest
from django.contrib.messages import constants
from django.test import Client

from agents.models import Agent, AgentVersion, ApiKey, Approval, DeterministicRule, Run
from agents.services import agent_version_publish
from tests.agents.test_admin_runs import a_run, an_approval
from tests.agents.test_fix_publish_on_save_rules import _BrowserForm, agent_page, row, saved
from tests.conftest import logged_in, make_agent
from tests.test_admin_views_access import staff

pytestmark = pytest.mark.django_db

DRAFT_NOTE = (
    "Agent {slug}: saved as a draft. v{number} stays live until you publish the agent (the Publish action of the "
    "agents list)."
)


# --- 1. a published agent's change is a draft, and the save says so --------------------------------------------


def published(agent: Agent) -> AgentVersion:
    """``agent`` published once (v1, live), its publish on save left off."""
    version = agent_version_publish(agent=agent, actor="test", via="tests")
    agent.refresh_from_db()
    assert version.number == 1 and agent.live_version == version and not agent.publish_on_save
    return version


def rule_page(client: Client, rule: DeterministicRule) -> tuple[str, dict[str, list[str]]]:
    """The rule's own page address and what a browser would post for it unchanged (with the Save button)."""
    url = f"/admin/agents/deterministicrule/{rule.pk}/change/"
    form = _BrowserForm("deterministicrule_form")
    form.feed(client.get(url).content.decode())
    posted: dict[str, list[str]] = {}
    for name, value in form.fields:
        posted.setdefault(name, []).append(value)
    return url, {**posted, "_save": ["Save"]}


def first_rule(agent: Agent) -> DeterministicRule:
    rule = DeterministicRule.objects.filter(agent=agent).order_by("order", "id").first()
    assert rule is not None
    return rule


def test_changing_a_rule_row_of_a_published_agent_says_the_change_is_a_draft_and_v1_stays_live(
    admin_client: Client, demo_agent: Agent
) -> None:
    v1 = published(demo_agent)
    rule = first_rule(demo_agent)
    url, posted = agent_page(admin_client, demo_agent)
    posted[f"{row(posted, demo_agent, rule)}-order"] = ["77"]
    told = saved(admin_client, url, posted)

    assert DeterministicRule.objects.get(pk=rule.pk).order == 77
    demo_agent.refresh_from_db()
    assert demo_agent.live_version == v1 and AgentVersion.objects.filter(agent=demo_agent).count() == 1
    assert told[0][0] == constants.SUCCESS and "was changed successfully" in told[0][1]
    assert told[1:] == [(constants.WARNING, DRAFT_NOTE.format(slug=demo_agent.slug, number=1))]


def test_changing_a_rule_on_its_own_page_says_which_agents_change_is_a_draft(
    admin_client: Client, demo_agent: Agent
) -> None:
    published(demo_agent)
    rule = first_rule(demo_agent)
    url, posted = rule_page(admin_client, rule)
    posted["order"] = ["78"]
    told = saved(admin_client, url, posted)

    assert DeterministicRule.objects.get(pk=rule.pk).order == 78
    assert told[0][0] == constants.SUCCESS and "was changed successfully" in told[0][1]
    assert told[1:] == [(constants.WARNING, DRAFT_NOTE.format(slug=demo_agent.slug, number=1))]


def test_changing_a_global_rule_speaks_of_the_agents_bound_to_its_server_only(
    admin_client: Client, demo_agent: Agent
) -> None:
    published(demo_agent)
    elsewhere = make_agent(slug="elsewhere", servers=[], with_demo_rules=False)
    published(elsewhere)  # bound to no server: the rule cannot reach it, and it is not looked at
    rule = first_rule(demo_agent)
    DeterministicRule.objects.filter(pk=rule.pk).update(agent=None)  # a global rule of the demo server
    url, posted = rule_page(admin_client, DeterministicRule.objects.get(pk=rule.pk))
    posted["order"] = ["79"]
    told = saved(admin_client, url, posted)

    assert told[1:] == [(constants.WARNING, DRAFT_NOTE.format(slug=demo_agent.slug, number=1))]


def test_a_save_that_changes_nothing_a_version_holds_says_nothing_of_a_draft(
    admin_client: Client, demo_agent: Agent
) -> None:
    """The time limit is read from the agent as stored (no version freezes it): it applies at once."""
    published(demo_agent)
    url, posted = agent_page(admin_client, demo_agent)
    posted["time_limit_s"] = ["91"]
    told = saved(admin_client, url, posted)

    assert Agent.objects.get(pk=demo_agent.pk).time_limit_s == 91
    assert [level for level, _text in told] == [constants.SUCCESS]


def test_an_agent_never_published_says_nothing_of_a_draft(admin_client: Client, demo_agent: Agent) -> None:
    """Its runs run its draft: the change is live at once."""
    url, posted = rule_page(admin_client, first_rule(demo_agent))
    posted["order"] = ["79"]
    assert [level for level, _text in saved(admin_client, url, posted)] == [constants.SUCCESS]


def test_a_save_that_published_on_save_keeps_its_messages(admin_client: Client, demo_agent: Agent) -> None:
    published(demo_agent)
    Agent.objects.filter(pk=demo_agent.pk).update(publish_on_save=True)
    rule = first_rule(demo_agent)
    url, posted = agent_page(admin_client, demo_agent)
    posted[f"{row(posted, demo_agent, rule)}-order"] = ["80"]
    told = saved(admin_client, url, posted)

    assert Agent.objects.get(pk=demo_agent.pk).live_version.number == 2  # type: ignore[union-attr]
    assert [level for level, _text in told] == [constants.SUCCESS, constants.SUCCESS]
    assert told[1][1] == f"Agent {demo_agent.slug}: v2 is live."

    url, posted = rule_page(admin_client, rule)
    posted["name"] = ["이름으로 찾기"]
    told = saved(admin_client, url, posted)
    assert Agent.objects.get(pk=demo_agent.pk).live_version.number == 3  # type: ignore[union-attr]
    assert [level for level, _text in told] == [constants.SUCCESS]


# --- 2. the question that led to the call, wherever the call is decided ----------------------------------------

# A masked query as stored, on two lines, with a direction override and a tag character (U+E0041, an invisible
# "A" a model reads and nobody sees).
QUERY = "김하늘 님 회의록을 저장해 줘\n연락처 ****\u202e\U000e0041 그리고 " + "아주 긴 설명 " * 30
QUERY_SHOWN = QUERY.replace("\u202e", "⟦U+202E⟧").replace("\U000e0041", "⟦U+E0041⟧")


def an_approval_with_a_question() -> Approval:
    run = a_run(status=Run.Status.AWAITING_APPROVAL)
    Run.objects.filter(pk=run.pk).update(query=QUERY)
    approval: Approval = an_approval(run)
    return approval


@pytest.mark.parametrize("page", ["change", "decide/approve", "decide/reject"])
def test_the_approval_pages_show_the_runs_whole_query_with_its_hidden_characters_written_out(
    admin_client: Client, page: str
) -> None:
    approval = an_approval_with_a_question()
    content = admin_client.get(f"/admin/agents/approval/{approval.pk}/{page}/").content.decode()
    [shown] = re.findall(r'<p class="approval-query" id="approval-query">(.*?)</p>', content, re.S)
    assert html.unescape(shown) == QUERY_SHOWN
    assert "\U000e0041" not in content and "\u202e" not in content


def test_an_approver_who_may_not_view_runs_sees_the_query_too() -> None:
    approver = logged_in(staff("ria", perms=("agents.view_approval", "agents.change_approval")))
    approval = an_approval_with_a_question()
    for page in ("change", "decide/approve"):
        response = approver.get(f"/admin/agents/approval/{approval.pk}/{page}/")
        assert response.status_code == 200 and response.context["run_url"] == ""  # no run's page for them
        assert response.context["run_query"] == QUERY_SHOWN


def test_the_dashboard_shows_each_pending_calls_query_shortened(admin_client: Client) -> None:
    approval = an_approval_with_a_question()
    content = admin_client.get("/admin/").content.decode()
    panel = content[content.index('id="dashboard-approvals"') :]
    panel = panel[panel.index(f'data-approval="{approval.pk}"') :]
    [shown] = re.findall(r'<div class="query"[^>]*>(.*?)</div>', panel[: panel.index("</tr>")], re.S)
    shown = html.unescape(shown)
    assert len(shown) == 120 and shown.endswith("…") and QUERY_SHOWN.startswith(shown[:-1])
    assert "⟦U+202E⟧⟦U+E0041⟧" in shown


def test_the_dashboard_never_cuts_a_written_out_character_in_two(admin_client: Client) -> None:
    run = a_run(status=Run.Status.AWAITING_APPROVAL)
    Run.objects.filter(pk=run.pk).update(query="가" * 115 + "\U000e0041" * 3)
    an_approval(run)
    content = admin_client.get("/admin/").content.decode()
    [shown] = re.findall(r'<div class="query"[^>]*>(.*?)</div>', content, re.S)
    assert html.unescape(shown) == "가" * 115 + "…"


# --- 3. the issued key's page tells a caller where to send it and what -----------------------------------------


def test_the_issued_keys_page_gives_the_endpoint_a_working_example_and_the_api_docs(admin_client: Client) -> None:
    agent = Agent.objects.create(slug="company-assistant", name="사내 비서")
    page = admin_client.post("/admin/agents/apikey/add/", {"name": "정산", "agents": [agent.pk]}).content.decode()
    [raw] = re.findall(r'id="raw-key" readonly value="(apk_[A-Za-z0-9_-]{43})"', page)
    assert "<code>POST /api/v1/runs</code>" in page
    assert re.search(r'<a href="/api/v1/docs/" id="issued-key-docs">the API documentation</a>', page)

    [example] = re.findall(r'<pre id="issued-key-example"[^>]*>(.*?)</pre>', page, re.S)
    example = html.unescape(example)
    [url] = re.findall(r'-X POST "([^"]+)"', example)
    [body] = re.findall(r"-d '([^']+)'", example)
    assert url == "http://testserver/api/v1/runs?wait=30" and f"Bearer {raw}" in example
    assert json.loads(body) == {"agent": "company-assistant", "query": "..."}
    # What it shows works: the key starts a run of that agent there (without the wait, which needs a worker).
    answered = Client().post(
        url.removesuffix("?wait=30"), body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}"
    )
    assert answered.status_code in (201, 202), answered.content
    assert Run.objects.get(api_key=ApiKey.objects.get()).agent == agent


def test_a_key_for_every_agent_shows_the_example_with_a_slug_to_fill_in(admin_client: Client) -> None:
    page = admin_client.post("/admin/agents/apikey/add/", {"name": "모두"}).content.decode()
    [example] = re.findall(r'<pre id="issued-key-example"[^>]*>(.*?)</pre>', page, re.S)
    assert "&lt;slug&gt;" in example and "<slug>" not in example
