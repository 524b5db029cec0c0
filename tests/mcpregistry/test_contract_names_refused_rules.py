"""A contract's save names the stored rules it leaves refused.

The rule editor refuses parameters a tool's contract refuses; the contract editor may tighten them on purpose (an
allowed list, a bound), and before it said nothing: every run a rule decided then failed its call
(``args:range:limit``) while the admin who tightened the contract had no word of it. Its page now names each enabled
rule whose fixed parameters the contract, as saved, refuses, with its agent and the reason code; a rule switched
off, or another tool's, is not named, and the save itself goes through (a contract is the safety boundary)."""

from __future__ import annotations

import html
import re

import pytest
from django.utils import translation

from agents.models import Agent, DeterministicRule
from mcpregistry.models import ToolContract
from tests.mcpregistry import test_contract_editor
from tests.mcpregistry.test_contract_editor import editor_post

pytestmark = pytest.mark.django_db

lookup = test_contract_editor.lookup  # the editor's tool and its contract (a fixture)


def warnings(client, response) -> list[str]:
    page = client.get(response.url).content.decode()
    return [
        html.unescape(re.sub(r"<[^>]+>", "", m)).strip()
        for m in re.findall(r'<li class="warning">(.*?)</li>', page, re.S)
    ]


@pytest.fixture
def rules(lookup):
    agent = Agent.objects.create(slug="ledger", name="장부")
    kept = DeterministicRule.objects.create(
        agent=agent, name="큰 조회", server=lookup.server, tool_name="lookup", params={"name": "김하늘", "limit": 40}
    )
    DeterministicRule.objects.create(
        agent=agent, name="꺼진 규칙", server=lookup.server, tool_name="lookup", params={"limit": 40}, enabled=False
    )
    DeterministicRule.objects.create(
        agent=None, name="전역 규칙", server=lookup.server, tool_name="lookup", params={"name": "이서준"}
    )
    DeterministicRule.objects.create(
        agent=agent, name="다른 도구", server=lookup.server, tool_name="lookup_backup", params={"name": "박"}
    )
    return kept


def test_a_tightened_contract_names_the_enabled_rules_it_refuses_and_saves(admin_client, lookup, rules) -> None:
    response = admin_client.post(
        f"/admin/mcpregistry/mcptool/{lookup.pk}/change/",
        editor_post(lookup, **{"contract-0-args__1__max": "10", "contract-0-args__0__allowed": "김하늘"}),
    )
    assert response.status_code == 302
    assert ToolContract.objects.get(tool=lookup).args["limit"]["max"] == 10  # saved: the boundary wins
    found = warnings(admin_client, response)
    assert len(found) == 2, found
    mine = next(text for text in found if "큰 조회" in text)
    assert "ledger" in mine and "args:range:limit" in mine
    shared = next(text for text in found if "전역 규칙" in text)
    assert "args:allowed:name" in shared and "every agent bound to its server" in shared
    assert not any("꺼진 규칙" in text or "다른 도구" in text for text in found)


def test_a_contract_that_refuses_no_rule_says_nothing_more(admin_client, lookup, rules) -> None:
    response = admin_client.post(
        f"/admin/mcpregistry/mcptool/{lookup.pk}/change/", editor_post(lookup, **{"contract-0-args__1__max": "50"})
    )
    assert response.status_code == 302
    assert warnings(admin_client, response) == []


def test_the_korean_page_says_it_in_korean(admin_client, lookup, rules) -> None:
    admin_client.cookies["django_language"] = "ko"
    with translation.override("ko"):
        response = admin_client.post(
            f"/admin/mcpregistry/mcptool/{lookup.pk}/change/",
            editor_post(lookup, **{"contract-0-args__1__max": "10"}),
        )
    found = warnings(admin_client, response)
    assert found and all("큰 조회" in text and "규칙" in text for text in found[:1])


def test_an_imported_contract_names_the_stored_rules_it_refuses_among_the_warnings(lookup, rules) -> None:
    from agents.configuration import config_export, config_import

    document = {"contracts": config_export()["contracts"]}  # the rules stay as stored (given, they are refused)
    entry = next(c for c in document["contracts"] if c["tool"] == "lookup")
    entry["args"]["limit"] = {**entry["args"]["limit"], "max": 10}
    report = config_import(actor="t", document=document, dry_run=True)
    assert [text for text in report.warnings if "큰 조회" in text and "args:range:limit" in text], report.warnings
    again = config_import(actor="t", document={"contracts": config_export()["contracts"]})  # nothing changed
    assert not [text for text in again.warnings if "큰 조회" in text]
