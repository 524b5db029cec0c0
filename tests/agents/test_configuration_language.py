"""``import_config`` speaks the platform's language: its problems' texts, the headings of its errors and the labels
of its report go through gettext, as do the eval sets' section and ``reconcile_runs``' lines. What stays as written
is what a document names (entries, fields, slugs) and pydantic's own messages.

The texts are checked under a translation that brackets every text it translates (``⟦…⟧``): a text left out of
gettext shows unbracketed, whatever the catalogue holds. One test reads the Korean catalogue itself."""

from __future__ import annotations

import copy
import io
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import translation
from django.utils.translation import trans_real

from agent_platform.errors import ApplicationError
from agents.configuration import config_export, config_import
from agents.versions import AGENT_FIELDS
from tests.agents.test_configuration import document

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _docs_token_may_be_passed_through(settings) -> None:  # type: ignore[no-untyped-def]
    settings.PLATFORM_MCP_ENV_PASSTHROUGH = ["DOCS_TOKEN"]


class _Bracketed:
    """A translation that returns the English catalogue's text in brackets."""

    def __init__(self, base: Any) -> None:
        self._base = base

    def gettext(self, message: str) -> str:
        return f"⟦{self._base.gettext(message)}⟧"

    def ngettext(self, singular: str, plural: str, number: int) -> str:
        return f"⟦{self._base.ngettext(singular, plural, number)}⟧"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


@contextmanager
def bracketed() -> Iterator[None]:
    """English, every translated text in brackets (for any language activated meanwhile, too); the language active
    before comes back unbracketed."""
    real = trans_real.translation
    with translation.override("en"), pytest.MonkeyPatch.context() as patch:
        patch.setattr(trans_real, "translation", lambda language: _Bracketed(real(language)))
        translation.activate("en")
        yield


def unbracketed(text: str) -> str:
    """``text`` without its bracketed parts (a translated text may hold another: innermost first)."""
    while True:
        shorter = re.sub(r"⟦[^⟦⟧]*⟧", " ", text)
        if shorter == text:
            return text
        text = shorter


def names_in(value: Any) -> set[str]:
    """The words a document names: its keys and its identifier-like values (slugs, ids, tool and field names)."""
    found: set[str] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                found.update(re.findall(r"[A-Za-z_]+", str(key)))
                stack.append(child)
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and re.fullmatch(r"[\w.*/-]+", item):
            found.update(re.findall(r"[A-Za-z_]+", item))
    return found


def assert_only_names_left(text: str, doc: dict[str, Any]) -> None:
    """Every English word outside the brackets is a name from the document: a sentence of ours left out of gettext
    ("unknown server", "no version", "is not valid") fails here."""
    left = set(re.findall(r"[A-Za-z_]{2,}", unbracketed(text))) - names_in(doc)
    assert not left, f"not translated: {sorted(left)} in:\n{text}"


def bad_document() -> dict[str, Any]:
    """A document with one problem of each kind the import names itself (the schema is valid)."""
    doc = document()
    doc["servers"][1]["env"] = {"DOCS_SECRET": {"set": True}}  # nothing stored to keep
    doc["tools"] = [{"mcp_id": "ghost", "tool": "search_employee"}]
    doc["contracts"].append({"mcp_id": "phantom", "tool": "get_asset_status"})
    doc["agents"].append({"slug": "lonely", "servers": ["nowhere", "docs"]})
    doc["agents"][0]["live_version"] = 7
    doc["rules"][0]["mcp_id"] = "spectre"
    doc["rules"].append({"agent": "nobody", "name": "orphan"})
    return doc


def test_the_problems_of_an_import_go_through_gettext() -> None:
    doc = bad_document()
    with bracketed(), pytest.raises(ApplicationError) as refused:
        config_import(actor="test", document=doc)
    message = refused.value.message
    lines = message.splitlines()
    assert lines[0] == "⟦configuration was not imported:⟧"
    for expected in (
        'servers[1] (docs): env.DOCS_SECRET: ⟦{"set": true} keeps the stored value, but no value is stored: give {"value": ...} or {"from_env": ...}⟧',
        "tools[0] (ghost.search_employee): ⟦unknown server 'ghost'⟧",
        "contracts[1] (phantom.get_asset_status): ⟦unknown server 'phantom'⟧",
        "agents[1] (lonely): ⟦unknown server(s): nowhere⟧",
        "agents[0] (assistant): live_version: ⟦no version 7 (give it in versions)⟧",
        "rules[0] (assistant.소속 조회): ⟦unknown server 'spectre'⟧",
        "rules[1] (nobody.orphan): ⟦unknown agent 'nobody'⟧",
    ):
        assert expected in lines, "\n".join(lines)
    assert_only_names_left(message, doc)


def test_an_invalid_document_is_headed_and_explained_through_gettext() -> None:
    doc = document()
    doc["servers"].append(copy.deepcopy(doc["servers"][1]))  # named twice
    with bracketed(), pytest.raises(ApplicationError) as refused:
        config_import(actor="test", document=doc)
    assert refused.value.message.splitlines()[0] == "⟦configuration is not valid:⟧"
    assert_only_names_left(refused.value.message, doc)


def content(**changes: Any) -> dict[str, Any]:
    """A version's content that is valid but for ``changes``."""
    return {"agent": dict.fromkeys(AGENT_FIELDS), "servers": [], "rules": [], "contracts": {}, **changes}


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"arms": [{"name": "a", "version": 1}] * 2}, "arms: ⟦a name is given twice⟧"),
        ({"versions": [{"number": 1, "content": content()}] * 2}, "versions: ⟦a number is given twice⟧"),
        ({"versions": [{"number": 1, "content": content(agent={"bogus": 1})}]}, "agent: ⟦missing "),
        ({"versions": [{"number": 1, "content": content(rules=[{"name": "r"}])}]}, "rules[0]: ⟦a rule has "),
        (
            {"versions": [{"number": 1, "content": content(contracts={"x": {}})}]},
            "contracts: ⟦'x' is not 'mcp_id/tool'⟧",
        ),
        (
            {"versions": [{"number": 1, "content": content(contracts={"s/t": {"bogus": 1}})}]},
            "contracts.s/t: ⟦unknown bogus⟧",
        ),
        ({"model": {"secrets": {"api_key": {}}}}, '⟦give exactly one of {"value": ...}'),
    ],
)
def test_the_documents_own_checks_explain_through_gettext(entry: dict[str, Any], expected: str) -> None:
    doc = document()
    doc["agents"][0].update(entry)
    with bracketed(), pytest.raises(ApplicationError) as refused:
        config_import(actor="test", document=doc)
    message = refused.value.message
    assert message.splitlines()[0] == "⟦configuration is not valid:⟧"
    assert expected in message
    # Pydantic's own words ("Value error") stay as pydantic writes them; ours are bracketed.
    assert_only_names_left(message.replace("Value error", ""), doc)


def test_the_report_labels_go_through_gettext() -> None:
    doc = document()
    doc["agents"][0]["publish_on_save"] = True
    with bracketed():
        first = config_import(actor="test", document=doc)
    assert first.created and all(item.startswith("⟦") and item.endswith("⟧") for item in first.created)
    assert "⟦version assistant v1⟧" in first.created

    exported = config_export()
    exported["agents"][0]["arms"] = [{"name": "a", "version": 1}]
    with bracketed():
        armed = config_import(actor="test", document=exported)
    assert armed.created == ["⟦arm assistant.a⟧"]
    assert all(item.startswith("⟦") for item in armed.unchanged)

    exported["agents"][0]["arms"] = []
    exported["agents"][0]["publish_on_save"] = False  # a published agent keeps its live version (v1): named
    exported["agents"][0]["live_version"] = 1
    with bracketed():
        unarmed = config_import(actor="test", document=exported)
    assert unarmed.deleted == ["⟦arm assistant.a⟧"]
    assert unarmed.updated == ["⟦agent assistant (publish_on_save)⟧"]

    exported = config_export()  # published, not publishing on save: its live version named, and exported
    exported["agents"][0]["versions"][0]["content"]["agent"]["system_prompt"] = "another prompt"
    with bracketed(), pytest.raises(ApplicationError) as refused:
        config_import(actor="test", document=exported)
    assert "agents[0] (assistant): versions: ⟦v1 is not the content of this installation's v1 " in refused.value.message
    assert_only_names_left(refused.value.message, exported)


def test_import_config_prints_its_report_through_gettext(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(document()), encoding="utf-8")
    out = io.StringIO()
    with bracketed():
        call_command("import_config", str(path), stdout=out)
    *items, summary = out.getvalue().splitlines()
    assert items and summary.startswith("⟦created ")
    for line in [*items, summary]:
        assert not unbracketed(line).strip(), line
    for line in items:  # "created: %(item)s", the item's label translated too
        assert line.startswith("⟦") and line.count("⟦") == 2, line


def test_the_eval_sets_section_speaks_through_gettext() -> None:
    doc = document()
    doc["eval_sets"] = "not a list"
    with bracketed(), pytest.raises(ApplicationError) as refused:
        config_import(actor="test", document=doc)
    assert "eval_sets: ⟦a list of eval sets⟧" in refused.value.message.splitlines()

    doc["eval_sets"] = ["not an object"]
    with bracketed(), pytest.raises(ApplicationError) as refused:
        config_import(actor="test", document=doc)
    assert "eval_sets[0]: ⟦an object⟧" in refused.value.message.splitlines()


def test_reconcile_runs_labels_each_line_through_gettext() -> None:
    out = io.StringIO()
    with bracketed():
        call_command("reconcile_runs", stdout=out)
    lines = out.getvalue().splitlines()
    assert "⟦worker_lost: 0⟧" in lines and len(lines) == 9
    assert all(line.startswith("⟦") and line.endswith("⟧") for line in lines)


# The Korean catalogue (locale/ko). The msgstrs expected here are the catalogue's: "unknown agent '%(agent)s'" was
# there already (evals); the others were added with this test.
def test_import_config_refuses_in_korean(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(bad_document()), encoding="utf-8")
    with override_settings(LANGUAGE_CODE="ko"), translation.override("ko"), pytest.raises(CommandError) as refused:
        call_command("import_config", str(path))
    lines = str(refused.value).splitlines()
    assert lines[0] == "설정을 가져오지 않았습니다:"
    assert "tools[0] (ghost.search_employee): 알 수 없는 서버 'ghost'" in lines
    assert "rules[1] (nobody.orphan): 알 수 없는 에이전트 'nobody'" in lines
    assert "unknown server" not in str(refused.value)
