"""Review fixes of agent versions (s39).

- The diff shows a change of a JSON value's kind (``1`` → ``true``, ``0`` → ``false``) and tells a dotted key
  (``"order.kind"``) from a nested one (``order`` → ``kind``): it said "the same content" of versions the engine
  runs differently.
- An agent's page opened before a roll back put the old live version back on a save of the name alone.
- Publishing a draft that can no longer run (a code rule that no longer loads) is refused, as a roll back to it
  is, by the service, the admin's action, publish on save (the edit is saved as a draft, said) and the command.
- ``agent_version rollback`` to the live content says nothing was published; ``publish --candidate`` twice makes
  one version.
- An arm's page offers its agent's versions only; a run's page names its arm and the runs list filters by it."""

from __future__ import annotations

import io
import re

import pytest
from django.contrib.messages import constants
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.test import Client

from agents.models import Agent, AgentArm, AgentVersion, DeterministicRule
from agents.services import agent_arm_create, agent_update, agent_version_publish, run_create
from agents.versions import version_diff
from mcpregistry.models import McpServer
from tests.agents.test_fix_publish_on_save_rules import agent_page, saved
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db

PROMPT = "회사 데이터로 답하세요."
BROKEN_CODE = "tests.example_rules.no_such_rule"


def publish(agent: Agent, **kwargs: object) -> AgentVersion:
    return agent_version_publish(agent=agent, actor="t", via="tests", **kwargs)  # type: ignore[arg-type]


def with_rule_when(content: dict, when: dict) -> dict:  # type: ignore[type-arg]
    return {**content, "rules": [{**content["rules"][0], "when": when}, *content["rules"][1:]]}


# --- 1. the diff ----------------------------------------------------------------------------------------------


def test_the_diff_shows_a_value_whose_kind_changed(demo_agent: Agent) -> None:
    content = publish(demo_agent).content
    name = content["rules"][0]["name"]
    old = with_rule_when(content, {"context": {"vip": 1}})
    new = with_rule_when(content, {"context": {"vip": True}})
    assert [(r["path"], r["old"], r["new"]) for r in version_diff(old, new)] == [
        (f"rules.{name}.when.context.vip", 1, True)
    ]
    old["agent"] = {**old["agent"], "model_params": {"temperature": 0}}
    new["agent"] = {**new["agent"], "model_params": {"temperature": False}}
    assert ("agent.model_params.temperature", 0, False) in [
        (r["path"], r["old"], r["new"]) for r in version_diff(old, new)
    ]
    # A number written another way is the same number to the engine.
    assert version_diff({"agent": {"max_iterations": 3}}, {"agent": {"max_iterations": 3.0}}) == []


def test_the_diff_tells_a_dotted_key_from_a_nested_one(demo_agent: Agent) -> None:
    content = publish(demo_agent).content
    name = content["rules"][0]["name"]
    old = with_rule_when(content, {"data": {"order.kind": "vip"}})
    new = with_rule_when(content, {"data": {"order": {"kind": "vip"}}})
    assert sorted((r["path"], r["old"], r["new"]) for r in version_diff(old, new)) == [
        (f'rules.{name}.when.data."order.kind"', "vip", None),
        (f"rules.{name}.when.data.order.kind", None, "vip"),
    ]


def test_the_diff_page_lists_the_change_of_kind(admin_client: Client, demo_agent: Agent) -> None:
    agent_update(agent=demo_agent, actor="t", via="tests", data={"model_params": {"temperature": 0}})
    publish(demo_agent)
    agent_update(agent=demo_agent, actor="t", via="tests", data={"model_params": {"temperature": False}})
    v2 = publish(demo_agent)
    assert v2.number == 2
    page = admin_client.get(f"/admin/agents/agentversion/{v2.pk}/diff/").content.decode()
    assert "<code>agent.model_params.temperature</code>" in page


# --- 2. a page opened before a roll back -----------------------------------------------------------------------


def two_versions(agent: Agent) -> AgentVersion:
    """v1, then v2 with another prompt, live; returns v2."""
    publish(agent)
    agent_update(agent=agent, actor="t", via="tests", data={"system_prompt": PROMPT})
    return publish(agent)


def test_a_page_opened_before_a_roll_back_keeps_the_roll_back(admin_client: Client, demo_agent: Agent) -> None:
    v2 = two_versions(demo_agent)
    url, posted = agent_page(admin_client, demo_agent)
    assert posted["live_version"] == [str(v2.pk)] and posted["initial-live_version"] == [str(v2.pk)]
    call_command("agent_version", "rollback", demo_agent.slug, "1", stdout=io.StringIO(), stderr=io.StringIO())
    demo_agent.refresh_from_db()
    assert demo_agent.live_version.number == 3

    posted["name"] = ["renamed"]
    told = saved(admin_client, url, posted)
    demo_agent.refresh_from_db()
    assert (demo_agent.name, demo_agent.live_version.number) == ("renamed", 3)
    assert (
        constants.WARNING,
        f"Agent {demo_agent.slug}: the live version changed to v3 after this page was opened (a publish, a roll back "
        "or another save); this save kept v3.",
    ) in told


def test_a_live_version_chosen_on_an_old_page_is_still_the_admins_choice(
    admin_client: Client, demo_agent: Agent
) -> None:
    two_versions(demo_agent)
    url, posted = agent_page(admin_client, demo_agent)
    publish(demo_agent, content=AgentVersion.objects.get(agent=demo_agent, number=1).content)  # v3, live
    v1 = AgentVersion.objects.get(agent=demo_agent, number=1)
    posted["live_version"] = [str(v1.pk)]
    saved(admin_client, url, posted)
    demo_agent.refresh_from_db()
    assert demo_agent.live_version == v1


# --- 3. a draft that cannot run is not published -----------------------------------------------------------------


def broken_code_rule(agent: Agent) -> None:
    """A code rule whose function is gone (the code changed after the rule was saved)."""
    DeterministicRule.objects.create(agent=agent, name="gone", code="tests.example_rules.route_order_lookup")
    DeterministicRule.objects.filter(agent=agent, name="gone").update(code=BROKEN_CODE)


@pytest.mark.parametrize("make_live", [True, False])
def test_publishing_a_draft_that_cannot_run_is_refused(demo_agent: Agent, make_live: bool) -> None:
    v1 = publish(demo_agent)
    broken_code_rule(demo_agent)
    with pytest.raises(ValidationError) as refused:
        publish(demo_agent, make_live=make_live)
    assert "no function 'no_such_rule'" in "; ".join(refused.value.messages)
    demo_agent.refresh_from_db()
    assert demo_agent.live_version == v1
    assert list(AgentVersion.objects.filter(agent=demo_agent).values_list("number", flat=True)) == [1]


def test_the_publish_action_says_why_nothing_was_published(admin_client: Client, demo_agent: Agent) -> None:
    v1 = publish(demo_agent)
    broken_code_rule(demo_agent)
    response = admin_client.post(
        "/admin/agents/agent/", {"action": "publish", "_selected_action": [demo_agent.pk]}, follow=True
    )
    [(level, text)] = [(m.level, str(m)) for m in response.context["messages"]]
    assert level == constants.ERROR
    assert text.startswith(f"Agent {demo_agent.slug} cannot be published: rules[")
    assert "no function 'no_such_rule'" in text
    demo_agent.refresh_from_db()
    assert demo_agent.live_version == v1


def test_publish_on_save_of_a_draft_that_cannot_run_saves_the_edit_as_a_draft(
    admin_client: Client, demo_agent: Agent
) -> None:
    agent_update(agent=demo_agent, actor="t", via="tests", data={"publish_on_save": True})
    demo_agent.refresh_from_db()
    v1 = demo_agent.live_version
    assert v1 is not None
    broken_code_rule(demo_agent)
    url, posted = agent_page(admin_client, demo_agent)
    posted["system_prompt"] = [PROMPT]
    told = saved(admin_client, url, posted)
    demo_agent.refresh_from_db()
    assert (demo_agent.system_prompt, demo_agent.live_version) == (PROMPT, v1)
    assert AgentVersion.objects.filter(agent=demo_agent).count() == 1
    refusal = [text for level, text in told if level == constants.WARNING and "not published on save" in text]
    assert refusal and "no function 'no_such_rule'" in refusal[0]
    assert any(f"v{v1.number} stays live" in text for _level, text in told)


def test_an_edit_elsewhere_of_an_agent_publishing_on_save_is_kept_as_a_draft(demo_agent: Agent) -> None:
    agent_update(agent=demo_agent, actor="t", via="tests", data={"publish_on_save": True})
    demo_agent.refresh_from_db()
    v1 = demo_agent.live_version
    broken_code_rule(demo_agent)
    agent_update(agent=demo_agent, actor="t", via="tests", data={"system_prompt": PROMPT})
    demo_agent.refresh_from_db()
    assert (demo_agent.system_prompt, demo_agent.live_version) == (PROMPT, v1)


def test_the_publish_command_refuses_a_draft_that_cannot_run(demo_agent: Agent) -> None:
    publish(demo_agent)
    broken_code_rule(demo_agent)
    with pytest.raises(Exception, match="no function 'no_such_rule'"):
        call_command("agent_version", "publish", demo_agent.slug, stdout=io.StringIO())
    assert AgentVersion.objects.filter(agent=demo_agent).count() == 1


# --- 4, 5. the command ---------------------------------------------------------------------------------------------


def test_a_roll_back_to_the_live_content_says_nothing_was_published(demo_agent: Agent) -> None:
    v1 = publish(demo_agent)
    agent_arm_create(actor="t", via="tests", data={"agent": demo_agent, "name": "a", "version": v1, "weight": 1})
    out, err = io.StringIO(), io.StringIO()
    call_command("agent_version", "rollback", demo_agent.slug, "1", stdout=out, stderr=err)
    assert out.getvalue() == "v1\n"
    assert err.getvalue() == f"Agent {demo_agent.slug}: v1 is already the live version; nothing was published.\n"
    assert AgentVersion.objects.filter(agent=demo_agent).count() == 1


def test_publishing_the_same_candidate_twice_makes_one_version(demo_agent: Agent) -> None:
    publish(demo_agent)
    agent_update(agent=demo_agent, actor="t", via="tests", data={"system_prompt": PROMPT})
    numbers = []
    for _time in range(2):
        out = io.StringIO()
        call_command("agent_version", "publish", demo_agent.slug, "--candidate", stdout=out)
        numbers.append(out.getvalue().strip())
    assert numbers == ["v2", "v2"]
    assert sorted(AgentVersion.objects.filter(agent=demo_agent).values_list("number", flat=True)) == [1, 2]
    demo_agent.refresh_from_db()
    assert demo_agent.live_version.number == 1


# --- 7, 8. arms ----------------------------------------------------------------------------------------------------


def version_options(page: str) -> list[str]:
    select = re.search(r'<select name="version".*?</select>', page, re.S)
    assert select is not None
    return re.findall(r'<option value="[0-9]+"[^>]*>([^<]*)</option>', select[0])


def test_an_arms_page_offers_the_versions_of_its_agent_only(
    admin_client: Client, demo_agent: Agent, demo_server: McpServer
) -> None:
    v1 = publish(demo_agent)
    other = make_agent(slug="other-assistant", servers=[demo_server])
    publish(other)
    page = admin_client.get(f"/admin/agents/agentarm/add/?agent={demo_agent.pk}").content.decode()
    assert version_options(page) == [f"{demo_agent.slug} v1"]
    arm = agent_arm_create(actor="t", via="tests", data={"agent": demo_agent, "name": "a", "version": v1, "weight": 0})
    page = admin_client.get(f"/admin/agents/agentarm/{arm.pk}/change/").content.decode()
    assert version_options(page) == [f"{demo_agent.slug} v1"]


def test_a_runs_page_names_its_arm_and_the_runs_list_filters_by_it(admin_client: Client, demo_agent: Agent) -> None:
    v1 = publish(demo_agent)
    agent_arm_create(actor="t", via="tests", data={"agent": demo_agent, "name": "b-arm", "version": v1, "weight": 1})
    armed = run_create(agent_slug=demo_agent.slug, query="A-1001", api_key=None)
    assert armed.arm == "b-arm"
    AgentArm.objects.filter(agent=demo_agent).update(weight=0)
    plain = run_create(agent_slug=demo_agent.slug, query="A-1002", api_key=None)
    assert plain.arm == ""

    page = admin_client.get(f"/admin/agents/run/{armed.pk}/timeline/").content.decode()
    assert '<span id="run-version">version v1</span> · <span id="run-arm">arm b-arm</span>' in page
    page = admin_client.get(f"/admin/agents/run/{plain.pk}/timeline/").content.decode()
    assert 'id="run-arm"' not in page

    listing = admin_client.get("/admin/agents/run/?arm=b-arm")
    assert listing.status_code == 200
    assert [str(run.pk) for run in listing.context["cl"].result_list] == [str(armed.pk)]
    assert "?arm=b-arm" in listing.content.decode()


def test_an_agent_stored_before_a_check_still_publishes_as_it_saves(demo_agent: Agent, settings: object) -> None:
    """The publish checks the stored draft as the stored agent is checked: a check added later applies where a
    value changes. A base URL with a user and password stored before that was refused (the agent still saved)
    was refused at every publish, and publish on save kept every later edit a draft."""
    settings.PLATFORM_MODEL_ALLOW_PRIVATE_URLS = ["127.0.0.1"]  # type: ignore[attr-defined]
    Agent.objects.filter(pk=demo_agent.pk).update(
        model_provider="openai_compatible",
        model_id="m",
        model_params={"base_url": "http://svc:hunter2pass@127.0.0.1:11434/v1"},
    )
    demo_agent.refresh_from_db()
    demo_agent.full_clean()
    assert publish(demo_agent).number == 1


def test_a_draft_whose_flow_graph_is_no_longer_registered_is_not_published(demo_agent: Agent, settings: object) -> None:
    Agent.objects.filter(pk=demo_agent.pk).update(
        mode=Agent.Mode.FLOW, flow_graph="tests.no_such.graph", model_params={"flow": {"mcp_id": "unused"}}
    )
    demo_agent.refresh_from_db()
    with pytest.raises(ValidationError) as refused:
        publish(demo_agent)
    assert "flow graph 'tests.no_such.graph' is not registered" in "; ".join(refused.value.messages)
