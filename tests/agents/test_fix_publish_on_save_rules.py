"""One save of an agent's page (the agent and its rule rows) publishes on save at most once, at its end, and not
where the same save chose the live version.

Defects held here: each rule row saved on the page published the draft on its own, so one save made a version per
row changed (and the agent's own edit published first, before its rows): the history listed states no one saved.
And a rule row's publish ignored the live version the same save chose: "roll back to v1 and reorder a rule" left a
new version of the draft live, not v1. The rows are posted as a browser posts the page."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from django.contrib.messages import constants
from django.test import Client

from agents.models import Agent, AgentVersion, DeterministicRule
from agents.versions import content_digest, version_content
from audit.models import AuditEvent

pytestmark = pytest.mark.django_db


class _BrowserForm(HTMLParser):
    """What a browser posts for the form ``form_id``: enabled inputs (ticked boxes only), text areas (less the
    first line break, which a browser drops), the options selected (a single choice: else the first)."""

    def __init__(self, form_id: str) -> None:
        super().__init__()
        self.form_id = form_id
        self.fields: list[tuple[str, str]] = []
        self._in_form = False
        self._textarea: tuple[str, list[str]] | None = None
        self._select: tuple[str, list[tuple[str, bool]], bool] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form" and a.get("id") == self.form_id:
            self._in_form = True
        name = a.get("name", "")
        if not self._in_form or "disabled" in a:
            return
        if tag == "input" and name:
            kind = a.get("type", "text")
            if kind in ("checkbox", "radio"):
                if "checked" in a:
                    self.fields.append((name, a.get("value") or "on"))
            elif kind not in ("submit", "button", "file", "image", "reset"):
                self.fields.append((name, a.get("value", "")))
        elif tag == "textarea" and name:
            self._textarea = (name, [])
        elif tag == "select" and name:
            self._select = (name, [], "multiple" in a)
        elif tag == "option" and self._select is not None:
            self._select[1].append((a.get("value", ""), "selected" in a))

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self._textarea[1].append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._in_form = False
        elif tag == "textarea" and self._textarea is not None:
            name, parts = self._textarea
            self.fields.append((name, "".join(parts).removeprefix("\n")))
            self._textarea = None
        elif tag == "select" and self._select is not None:
            name, options, multiple = self._select
            chosen = [value for value, selected in options if selected]
            if not multiple:
                chosen = chosen[:1] or [value for value, _ in options[:1]]
            self.fields.extend((name, value) for value in chosen)
            self._select = None


def agent_page(client: Client, agent: Agent) -> tuple[str, dict[str, list[str]]]:
    """The agent's page address and what a browser would post for it unchanged (with the Save button)."""
    url = f"/admin/agents/agent/{agent.pk}/change/"
    form = _BrowserForm("agent_form")
    form.feed(client.get(url).content.decode())
    posted: dict[str, list[str]] = {}
    for name, value in form.fields:
        posted.setdefault(name, []).append(value)
    return url, {**posted, "_save": ["Save"]}


def saved(client: Client, url: str, posted: dict[str, list[str]]) -> list[tuple[int, str]]:
    """Post the page; returns the messages the admin sees after the save (which must succeed)."""
    response = client.post(url, posted, follow=True)
    assert response.redirect_chain, response.content.decode()[:2000]
    return [(m.level, str(m)) for m in response.context["messages"]]


def row(posted: dict[str, list[str]], agent: Agent, rule: DeterministicRule) -> str:
    """The prefix of ``rule``'s row on the page (``rules-<n>``)."""
    for key, values in posted.items():
        if key.startswith("rules-") and key.endswith("-id") and values == [str(rule.pk)]:
            return key.removesuffix("-id")
    raise AssertionError(f"no row for rule {rule.pk} of {agent.slug}")


def actions_since(seq: int) -> list[str]:
    return list(AuditEvent.objects.filter(seq__gt=seq).order_by("seq").values_list("action", flat=True))


def last_seq() -> int:
    return AuditEvent.objects.order_by("-seq").values_list("seq", flat=True).first() or 0


def publishing_on_save(client: Client, agent: Agent) -> AgentVersion:
    """Ticks publish on save on the agent's page (v1 is published); returns v1."""
    url, posted = agent_page(client, agent)
    posted["publish_on_save"] = ["on"]
    saved(client, url, posted)
    agent.refresh_from_db()
    assert agent.live_version is not None and agent.live_version.number == 1
    return agent.live_version


def live(agent: Agent) -> AgentVersion | None:
    agent.refresh_from_db()
    return agent.live_version


@pytest.mark.slow
def test_rolling_back_and_changing_a_rule_row_in_one_save_keeps_the_chosen_version_live(
    admin_client: Client, demo_agent: Agent
) -> None:
    v1 = publishing_on_save(admin_client, demo_agent)
    first, second = DeterministicRule.objects.filter(agent=demo_agent).order_by("order", "id")[:2]
    url, posted = agent_page(admin_client, demo_agent)
    posted[f"{row(posted, demo_agent, first)}-order"] = ["55"]
    saved(admin_client, url, posted)
    assert live(demo_agent).number == 2  # type: ignore[union-attr]

    url, posted = agent_page(admin_client, demo_agent)
    posted["live_version"] = [str(v1.pk)]  # roll back to v1 ...
    posted[f"{row(posted, demo_agent, second)}-order"] = ["66"]  # ... and change a rule row
    seq = last_seq()
    told = saved(admin_client, url, posted)

    assert live(demo_agent) == v1
    assert AgentVersion.objects.filter(agent=demo_agent).count() == 2
    assert DeterministicRule.objects.get(pk=second.pk).order == 66  # the row is saved, as a draft
    assert actions_since(seq) == ["config.agent.update", "config.deterministic_rule.update"]
    assert told[-1] == (constants.SUCCESS, f"Agent {demo_agent.slug}: v1 is live.")


@pytest.mark.slow
def test_one_save_of_three_rule_rows_publishes_one_version_after_every_row(
    admin_client: Client, demo_agent: Agent
) -> None:
    publishing_on_save(admin_client, demo_agent)
    rules = list(DeterministicRule.objects.filter(agent=demo_agent).order_by("order", "id")[:3])
    url, posted = agent_page(admin_client, demo_agent)
    for order, rule in zip((93, 92, 91), rules, strict=True):  # the three reversed, after every other rule
        posted[f"{row(posted, demo_agent, rule)}-order"] = [str(order)]
    seq = last_seq()
    told = saved(admin_client, url, posted)

    version = live(demo_agent)
    assert version is not None and version.number == 2 and version.note == "published on save"
    assert AgentVersion.objects.filter(agent=demo_agent).count() == 2
    assert [r["name"] for r in version.content["rules"]][-3:] == [rule.name for rule in reversed(rules)]
    assert version.digest == content_digest(version_content(demo_agent))  # the draft as the whole save left it
    assert actions_since(seq) == [
        *["config.deterministic_rule.update"] * 3,
        "config.agent_version.publish",
        "config.agent.update",  # its live version
    ]
    assert told[-1] == (constants.SUCCESS, f"Agent {demo_agent.slug}: v2 is live.")


def test_the_agents_own_change_publishes_once_after_its_rule_rows(admin_client: Client, demo_agent: Agent) -> None:
    publishing_on_save(admin_client, demo_agent)
    rule = DeterministicRule.objects.filter(agent=demo_agent).order_by("order", "id").first()
    assert rule is not None
    url, posted = agent_page(admin_client, demo_agent)
    posted["system_prompt"] = ["회사 도우미: 짧게 답하세요."]
    posted[f"{row(posted, demo_agent, rule)}-order"] = ["81"]
    seq = last_seq()
    saved(admin_client, url, posted)

    version = live(demo_agent)
    assert version is not None and version.number == 2
    assert version.content["agent"]["system_prompt"] == "회사 도우미: 짧게 답하세요."
    assert [r["name"] for r in version.content["rules"]][-1] == rule.name  # its row moved last
    assert version.digest == content_digest(version_content(demo_agent))
    assert actions_since(seq) == [
        "config.agent.update",
        "config.deterministic_rule.update",
        "config.agent_version.publish",
        "config.agent.update",
    ]


def test_ticking_publish_on_save_with_a_rule_row_changed_publishes_once(
    admin_client: Client, demo_agent: Agent
) -> None:
    rule = DeterministicRule.objects.filter(agent=demo_agent).order_by("order", "id").first()
    assert rule is not None
    url, posted = agent_page(admin_client, demo_agent)
    posted["publish_on_save"] = ["on"]
    posted[f"{row(posted, demo_agent, rule)}-order"] = ["91"]
    told = saved(admin_client, url, posted)

    version = live(demo_agent)
    assert version is not None and version.number == 1
    assert [r["name"] for r in version.content["rules"]][-1] == rule.name
    assert AgentVersion.objects.filter(agent=demo_agent).count() == 1
    assert told[-1] == (constants.SUCCESS, f"Agent {demo_agent.slug}: v1 is live.")


@pytest.mark.slow
def test_a_save_that_changes_nothing_a_version_freezes_publishes_nothing_and_says_nothing_of_versions(
    admin_client: Client, demo_agent: Agent
) -> None:
    publishing_on_save(admin_client, demo_agent)
    url, posted = agent_page(admin_client, demo_agent)
    posted["shadow_sample_rate"] = ["0.5"]
    told = saved(admin_client, url, posted)

    assert AgentVersion.objects.filter(agent=demo_agent).count() == 1
    assert not any("is live" in text for _, text in told)


@pytest.mark.slow
def test_a_rule_saved_on_its_own_page_still_publishes_on_save(admin_client: Client, demo_agent: Agent) -> None:
    publishing_on_save(admin_client, demo_agent)
    rule = DeterministicRule.objects.filter(agent=demo_agent).order_by("order", "id").first()
    assert rule is not None
    url = f"/admin/agents/deterministicrule/{rule.pk}/change/"
    form = _BrowserForm("deterministicrule_form")
    form.feed(admin_client.get(url).content.decode())
    posted: dict[str, list[str]] = {}
    for name, value in form.fields:
        posted.setdefault(name, []).append(value)
    posted["order"] = ["99"]
    seq = last_seq()
    saved(admin_client, url, {**posted, "_save": ["Save"]})

    version = live(demo_agent)
    assert version is not None and version.number == 2 and version.note == "published on save"
    assert actions_since(seq) == [
        "config.deterministic_rule.update",
        "config.agent_version.publish",
        "config.agent.update",
    ]
