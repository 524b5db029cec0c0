"""Configuration as code, as a review found it: what goes to the OS or the network is kept as written (a folder
named in decomposed Korean), a bracket left open in a URL is a refusal at its field (not a traceback or a 500), and
an unknown key of ``tool_selection`` or ``mcp_context`` is told with the valid keys, in the reader's language."""

from __future__ import annotations

import copy
import re
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from django.utils import translation

from agent_platform.errors import ApplicationError
from agents.configuration import config_export, config_import
from agents.models import Agent
from agents.services import agent_version_publish
from mcpregistry.models import McpServer
from mcpregistry.services import mcp_server_discover, mcp_server_update
from tests.agents.test_agent_form import agent_post
from tests.agents.test_configuration import document
from tests.conftest import DEMO_SECRET
from tests.mcpregistry.test_registry import post_server_form

pytestmark = pytest.mark.django_db

DECOMPOSED = unicodedata.normalize("NFD", "도구모음")
TOPK_IN_KOREAN = "'topk'은(는) 올바른 키가 아닙니다 ('top_k'을(를) 뜻했나요?)"


@pytest.fixture(autouse=True)
def _docs_token_may_be_passed_through(settings) -> None:  # type: ignore[no-untyped-def]
    settings.PLATFORM_MCP_ENV_PASSTHROUGH = ["DOCS_TOKEN"]


def refused(doc: dict[str, Any], language: str = "en") -> str:
    with translation.override(language), pytest.raises(ApplicationError) as refusal:
        config_import(actor="t", document=doc)
    return refusal.value.message


def errors_shown(page: str) -> str:
    return " ".join(re.findall(r'<ul class="errorlist[^>]*>(.*?)</ul>', page, re.S)).replace("&#x27;", "'")


# ---- kept as written ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_export_re_imports_unchanged_with_a_server_in_a_folder_named_in_decomposed_korean(tmp_path: Path) -> None:
    # A folder made on macOS keeps its decomposed name; Linux names are bytes, and the composed one names nothing.
    folder = tmp_path / DECOMPOSED
    folder.mkdir()
    script = folder / "serve.py"
    script.write_text(
        f"import runpy, sys\nsys.path.insert(0, {str(settings.BASE_DIR)!r})\n"
        f"runpy.run_module({settings.PLATFORM_DEMO_SERVER_MODULE!r}, run_name='__main__')\n"
    )
    server = McpServer(
        mcp_id="in-folder",
        name="in folder",
        command=sys.executable,
        args=[str(script)],
        cwd=str(folder),
        env={"FAILURE_MODE": "none", "INTERNAL_API_KEY": DEMO_SECRET},
        public_env=["FAILURE_MODE"],
    )
    mcp_server_update(server=server, actor="t", via="tests")

    report = config_import(actor="t", document=config_export())

    assert report.updated == [] and report.unchanged == ["server in-folder"]
    stored = McpServer.objects.get(mcp_id="in-folder")
    assert (stored.cwd, stored.args) == (str(folder), [str(script)])
    discovery = mcp_server_discover(server=stored, actor="t", via="tests")
    assert discovery.ok, discovery.error  # the server still starts from its folder


def test_what_a_server_passes_to_the_os_or_the_network_is_stored_as_written_and_its_name_composed() -> None:
    doc = {
        "servers": [
            {
                "mcp_id": "local",
                "name": DECOMPOSED,
                "command": sys.executable,
                "args": [f"/srv/{DECOMPOSED}/serve.py"],
                "cwd": f"/srv/{DECOMPOSED}",
                "env": {"LABEL": {"value": DECOMPOSED}},
                "public_env": ["LABEL"],
            },
            {"mcp_id": "remote", "transport": "streamable_http", "url": f"https://example.com/{DECOMPOSED}/mcp"},
        ]
    }
    config_import(actor="t", document=doc)
    local, remote = McpServer.objects.get(mcp_id="local"), McpServer.objects.get(mcp_id="remote")
    assert local.args == [f"/srv/{DECOMPOSED}/serve.py"] and local.cwd == f"/srv/{DECOMPOSED}"
    assert local.env == {"LABEL": DECOMPOSED}
    assert remote.url == f"https://example.com/{DECOMPOSED}/mcp"
    assert local.name == "도구모음"  # a name is compared, and composed as before
    assert config_import(actor="t", document=doc).updated == []


# ---- a bracket left open in a URL -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("transport", "url"),
    [
        ("streamable_http", "http://[::1/mcp"),
        ("sse", "http://[::1/mcp"),
        ("streamable_http", "https://[fe80::1%25eth0/mcp"),
    ],
)
def test_a_server_url_with_a_bracket_left_open_is_refused_at_its_entry_and_field(transport: str, url: str) -> None:
    doc = document()
    doc["servers"][1].update(transport=transport, url=url)
    assert "servers[1] (docs): url: http:// 또는 https:// URL을 입력하십시오." in refused(doc, "ko")


def test_a_model_base_url_with_a_bracket_left_open_is_refused_at_its_entry_and_field() -> None:
    doc = document()
    doc["agents"][0]["model"].update(provider="openai_compatible", model_id="m", params={"base_url": "http://[::1/v1"})
    assert "agents[0] (assistant): model_params: http:// 또는 https:// URL을 입력하십시오." in refused(doc, "ko")


def test_the_admin_shows_a_url_with_a_bracket_left_open_as_an_error_of_its_field(admin_client: Client) -> None:
    response = post_server_form(admin_client, None, transport="streamable_http", command="", url="http://[::1/mcp")
    assert response.status_code == 200  # was a 500
    assert "Enter an http:// or https:// URL." in errors_shown(response.content.decode())
    response = admin_client.post(
        "/admin/agents/agent/add/",
        agent_post(model_provider="openai_compatible", model_id="m", model_params='{"base_url": "http://[::1/v1"}'),
    )
    assert response.status_code == 200  # was a 500
    assert "Enter an http:// or https:// URL." in errors_shown(response.content.decode())
    assert not Agent.objects.filter(slug="flowing").exists()


# ---- an unknown settings key ----------------------------------------------------------------------------------


def test_an_unknown_tool_selection_key_is_told_with_the_valid_keys_in_korean() -> None:
    doc = document()
    doc["agents"][0]["tool_selection"] = {"topk": 3}
    message = refused(doc, "ko")
    assert f"agents[0] (assistant): tool_selection: topk: {TOPK_IN_KOREAN}" in message
    assert "Extra inputs are not permitted" not in message


def test_an_unknown_key_deep_in_mcp_context_names_the_keys_valid_there() -> None:
    doc = document()
    doc["agents"][0]["mcp_context"] = {"resources": [{"mcp_id": "company", "uri": "doc://a", "urii": "x"}]}
    assert (
        "mcp_context: resources.0.urii: 'urii' is not a valid key (did you mean 'uri'?); the valid keys are: "
        "mcp_id, uri"
    ) in refused(doc)


def test_a_version_with_an_unknown_tool_selection_key_is_told_with_the_valid_keys(demo_agent: Agent) -> None:
    agent_version_publish(agent=demo_agent, actor="t", via="tests")
    doc = config_export()
    entry = doc["agents"][0]
    version = copy.deepcopy(entry["versions"][0])
    version["number"] = 9
    version["content"]["agent"]["tool_selection"] = {"topk": 3}
    entry["versions"].append(version)
    assert f"versions: v9: agent.tool_selection: topk: {TOPK_IN_KOREAN}" in refused(doc, "ko")


def test_the_agent_form_tells_an_unknown_tool_selection_key_only_with_the_valid_keys(admin_client: Client) -> None:
    response = admin_client.post(
        "/admin/agents/agent/add/", agent_post(tool_selection='{"topk": 3}'), HTTP_ACCEPT_LANGUAGE="ko"
    )
    shown = errors_shown(response.content.decode())
    assert TOPK_IN_KOREAN in shown and "Extra inputs are not permitted" not in shown


def test_a_model_base_url_with_a_decomposed_korean_path_re_imports_unchanged(settings: Any) -> None:
    """The model server routes the path as written: composed, it named another path."""
    from agents.services import agent_create

    settings.PLATFORM_MODEL_ALLOW_PRIVATE_URLS = ["127.0.0.1"]
    url = "http://127.0.0.1:8000/" + unicodedata.normalize("NFD", "모델") + "/v1"
    data = {"slug": "llm", "name": "llm", "model_provider": "openai_compatible", "model_id": "m"}
    agent = agent_create(actor="t", via="tests", data={**data, "model_params": {"base_url": url}}, servers=[])

    report = config_import(actor="t", document=config_export())

    assert "agent llm" not in report.updated
    assert Agent.objects.get(pk=agent.pk).model_params["base_url"] == url
