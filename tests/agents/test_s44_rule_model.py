"""The deterministic rule's model and editor after the s44 review.

1. A code rule kept conditions, a server, a tool and params that no run applies (its code decides them, seed
   000): saved without a word. Now refused where they are new to it; a code rule stored with them still saves.
2. A page refused for a secret in a context value or an argument sent the secret back in its HTML.
3. The secret refusals named neither the argument nor the context key.
4. An unknown argument was said as ``args:unknown:nmae: …`` without the tool's arguments.
5. The editor's "tool" label was the only lowercase one.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from agents.configuration import config_export, config_import
from agents.models import Agent, DeterministicRule
from agents.services import deterministic_rule_update
from mcpregistry.models import McpServer
from tests.conftest import make_agent

ADD = "/admin/agents/deterministicrule/add/"
CODE = "tests.example_rules.route_order_lookup"
API_KEY = "sk-abcdefghijklmnopqrstuvwx1234"
PARAM_SECRET = "sk-zyxwvutsrqponmlkjihgfe98765"


def errors(page: str) -> str:
    return " ".join(re.findall(r'<ul class="errorlist[^>]*>(.*?)</ul>', page, re.S))


def code_rule(**fields: Any) -> DeterministicRule:
    return DeterministicRule(agent=None, name="주문", code=CODE, **fields)


# ---- 1. a code rule's conditions, server, tool and params ----------------------------------------------------------


@pytest.mark.django_db
def test_a_code_rule_with_conditions_or_params_is_refused_naming_them() -> None:
    with pytest.raises(ValidationError) as refused:
        code_rule(when={"any_keywords": ["주문"]}, params={"name": "홍길동"}).full_clean()
    said = " ".join(refused.value.message_dict["code"])
    assert "A code rule decides its own conditions, tool and parameters in its code" in said
    assert "clear conditions, parameters template." in said


def test_a_code_rule_naming_a_server_and_tool_is_refused(demo_server: McpServer) -> None:
    with pytest.raises(ValidationError) as refused:
        code_rule(server=demo_server, tool_name="search_employee").full_clean()
    assert "clear server, tool." in " ".join(refused.value.message_dict["code"])
    # What a run applies to a code rule's match, as to an admin rule's, is kept.
    code_rule(answer_template="{result}", force_first_tool="").full_clean()


def test_a_stored_code_rule_with_them_still_saves_but_takes_no_new_ones(demo_server: McpServer) -> None:
    rule = DeterministicRule.objects.create(
        agent=None, name="주문", code=CODE, when={"any_keywords": ["주문"]}, params={"q": "{query}"}
    )
    rule.enabled, rule.order, rule.name = False, 5, "주문 (끔)"
    deterministic_rule_update(rule=rule, actor="test", via="tests")
    rule.params = {"q": "{query}", "name": "홍길동"}
    with pytest.raises(ValidationError, match="clear parameters template"):
        deterministic_rule_update(rule=rule, actor="test", via="tests")
    rule.refresh_from_db()
    assert (rule.enabled, rule.order) == (False, 5)
    rule.delete()
    # An admin rule given a code keeps its conditions stored, but no run would read them any more: refused.
    admin_rule = DeterministicRule.objects.create(
        agent=None, name="직원", server=demo_server, tool_name="search_employee", when={"any_keywords": ["소속"]}
    )
    admin_rule.code = CODE
    with pytest.raises(ValidationError, match="clear conditions, server, tool"):
        admin_rule.full_clean()


def test_the_editor_refuses_a_code_rule_with_a_keyword_the_import_leaves_it_out(admin_client: Client, db: Any) -> None:
    post = {
        "name": "주문",
        "order": "10",
        "enabled": "on",
        "code": CODE,
        "when__editor": "1",
        "when__any_keywords": "주문",
        "params__editor": "1",
        "answer_template": "",
    }
    page = admin_client.post(ADD, post).content.decode()
    assert "no run applies them here: clear conditions." in errors(page)
    assert not DeterministicRule.objects.exists()
    # An export written before the refusal still imports: what no run reads is left out, with a warning.
    report = config_import(
        actor="t", document={"rules": [{"name": "주문", "code": CODE, "when": {"any_keywords": ["x"]}}]}
    )
    assert any("a code rule decides its own conditions" in w and "left out: when" in w for w in report.warnings)
    assert DeterministicRule.objects.get(name="주문").when == {}


def test_an_export_of_a_code_rule_stored_with_conditions_imports_into_an_empty_installation(db: Any) -> None:
    """A code rule stored with conditions, a server, a tool and parameters before they were refused: its export
    holds none of them, and an older export that does imports, into an installation without the rule too."""
    server = McpServer.objects.create(mcp_id="order-service", name="order-service", command="python3", args=[])
    agent = Agent.objects.create(slug="desk", name="desk")
    agent.servers.set([server])
    rule = DeterministicRule.objects.create(
        agent=agent,
        name="주문",
        code=CODE,
        server=server,
        tool_name="lookup",
        when={"any_keywords": ["주문"]},
        params={"q": "{query}"},
    )
    entry = next(e for e in config_export()["rules"] if e["name"] == "주문")
    assert (entry["mcp_id"], entry["tool"], entry["when"], entry["params"]) == (None, "", {}, {})

    older = {**entry, "mcp_id": "order-service", "tool": "lookup", "when": {"any_keywords": ["주문"]}}
    rule.delete()
    report = config_import(actor="t", document={"rules": [older]})
    imported = DeterministicRule.objects.get(name="주문")
    assert (imported.code, imported.server, imported.when) == (CODE, None, {})
    assert any("left out: when, mcp_id, tool" in w for w in report.warnings), report.warnings


# ---- 2 and 3. secrets: named, and not sent back ---------------------------------------------------------------------


def test_the_secret_refusals_name_the_argument_and_the_context_key(demo_agent: Agent) -> None:
    rule = DeterministicRule(
        agent=demo_agent,
        name="r",
        server=demo_agent.servers.get(),
        tool_name="search_employee",
        when={"context": {"apiKey": API_KEY, "tier": "gold"}},
        params={"name": PARAM_SECRET},
    )
    with pytest.raises(ValidationError) as refused:
        rule.full_clean()
    said = refused.value.message_dict
    assert said["params"] == [
        "This holds a secret under its argument 'name' (the audit record hides it), but the parameters template is "
        "stored, shown and exported in clear: give the secret as a secret header or environment value of the rule's "
        "server instead, which is encrypted at rest and never shown."
    ]
    assert said["when"] == [
        "context: this holds a secret under its key 'apiKey' (the audit record hides it), but a rule's conditions "
        "are stored, shown and exported in clear: compare the caller's context with a value that is no secret."
    ]


def editor_post(agent: Agent, **changes: Any) -> dict[str, Any]:
    post: dict[str, Any] = {
        "agent": str(agent.pk),
        "name": "비밀",
        "order": "10",
        "enabled": "on",
        "server": str(agent.servers.get().pk),
        "tool_name": "search_employee",
        "code": "",
        "when__editor": "1",
        "when__any_keywords": "소속",
        "when__context": f"apiKey={API_KEY}\ntier=gold",
        "params__editor": "1",
        "params__names": ["name"],
        "params__value__name": PARAM_SECRET,
        "answer_template": "",
    }
    post.update(changes)
    return post


def test_a_page_refused_for_a_secret_does_not_send_it_back(admin_client: Client, demo_agent: Agent) -> None:
    response = admin_client.post(ADD, editor_post(demo_agent))
    page = response.content.decode()
    assert response.status_code == 200
    assert API_KEY not in page and PARAM_SECRET not in page
    said = errors(page)
    assert "context equals: apiKey: not sent back, as it holds a secret: type it again without the secret." in said
    assert "name: not sent back, as it holds a secret: type it again without the secret." in said
    assert "tier=gold" in page  # what holds no secret is shown as typed
    assert not DeterministicRule.objects.filter(name="비밀").exists()


def test_a_json_view_refused_for_a_secret_does_not_send_it_back(admin_client: Client, demo_agent: Agent) -> None:
    entry = {
        "agent": demo_agent.slug,
        "name": "비밀",
        "mcp_id": demo_agent.servers.get().mcp_id,
        "tool": "search_employee",
        "when": {"any_keywords": ["소속"], "context": {"apiKey": API_KEY}},
        "params": {"name": PARAM_SECRET},
    }
    post = editor_post(demo_agent, when__context="", params__value__name="", rule_json=json.dumps(entry))
    page = admin_client.post(ADD, post).content.decode()
    assert API_KEY not in page and PARAM_SECRET not in page
    assert "apiKey: not sent back" in errors(page)


def test_a_stored_rule_s_unchanged_values_are_shown_as_they_were(admin_client: Client, demo_agent: Agent) -> None:
    rule = DeterministicRule.objects.create(
        agent=demo_agent,
        name="저장",
        server=demo_agent.servers.get(),
        tool_name="search_employee",
        when={"any_keywords": ["소속"]},
        params={"name": "{query}"},
    )
    page = admin_client.post(
        f"/admin/agents/deterministicrule/{rule.pk}/change/",
        editor_post(demo_agent, name="", params__value__name="{query}", when__context=""),
    ).content.decode()
    assert "not sent back" not in errors(page)
    assert 'value="{query}"' in page


# ---- 4. an unknown argument -----------------------------------------------------------------------------------------


def test_an_unknown_argument_is_said_with_the_tools_arguments(demo_server: McpServer) -> None:
    agent = make_agent(slug="checked", servers=[demo_server], with_demo_rules=False)
    tool = demo_server.tools.select_related("contract").get(name="search_employee")
    names = ", ".join(sorted(tool.contract.args))
    rule = DeterministicRule(
        agent=agent, name="r", server=demo_server, tool_name="search_employee", params={"nmae": "x", "name": "x"}
    )
    with pytest.raises(ValidationError) as refused:
        rule.full_clean()
    assert refused.value.message_dict["params"] == [f"The tool has no argument 'nmae'; its arguments are: {names}."]
    ping = DeterministicRule(agent=agent, name="p", server=demo_server, tool_name="ping", params={"verbose": "yes"})
    with pytest.raises(ValidationError) as refused:
        ping.full_clean()
    assert refused.value.message_dict["params"] == ["The tool has no argument 'verbose'; it takes none."]


# ---- 5. labels ------------------------------------------------------------------------------------------------------


def test_the_editor_s_labels_are_capitalised(admin_client: Client, db: Any) -> None:
    page = admin_client.get(ADD).content.decode()
    labels = re.findall(r"<label[^>]*>([^<]*):</label>", page)
    assert "Tool" in labels and "Force the model&#x27;s first tool" in labels and "Rule as JSON" in labels
    assert [label for label in labels if label[:1].islower()] == []
