"""The agent form: every documented setting, the flow graph as a choice of registered graphs, validated."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from agents.models import Agent

pytestmark = pytest.mark.django_db


def agent_post(**changes: object) -> dict[str, object]:
    data: dict[str, object] = {
        "slug": "flowing",
        "name": "흐름",
        "enabled": "on",
        "mode": "react",
        "flow_graph": "",
        "system_prompt": "",
        "deterministic_instruction": "x",
        "answer_template": "",
        "no_match_answer": "",
        "language": "ko",
        "model_provider": "offline",
        "model_id": "",
        "model_params": "{}",
        "servers": [],
        "max_iterations": "6",
        "time_limit_s": "120",
        "answer_from_deterministic": "on",
        "rules-TOTAL_FORMS": "0",
        "rules-INITIAL_FORMS": "0",
        "rules-MIN_NUM_FORMS": "0",
        "rules-MAX_NUM_FORMS": "1000",
    }
    data.update(changes)
    return data


def test_the_form_shows_every_setting_and_the_registered_flow_graphs(admin_client: Client) -> None:
    page = admin_client.get("/admin/agents/agent/add/").content.decode()
    for name in ("flow_graph", "time_limit_s", "answer_from_deterministic", "language", "no_match_answer"):
        assert f'name="{name}"' in page, name
    assert '<option value="agents.flows.sequential.build_graph">' in page
    assert "agents/agent_form.js" in page


def test_flow_mode_without_a_graph_is_refused_naming_the_registered_ones(admin_client: Client) -> None:
    page = admin_client.post("/admin/agents/agent/add/", agent_post(mode="flow")).content.decode()
    errors = " ".join(re.findall(r'<ul class="errorlist[^>]*>(.*?)</ul>', page, re.S))
    assert "Flow mode needs a flow graph" in errors and "agents.flows.parallel.build_graph" in errors


def test_a_flow_graph_that_cannot_be_imported_is_refused(admin_client: Client, settings) -> None:
    settings.PLATFORM_FLOW_GRAPHS = ["agents.flows.nowhere.build_graph"]
    page = admin_client.post(
        "/admin/agents/agent/add/", agent_post(mode="flow", flow_graph="agents.flows.nowhere.build_graph")
    ).content.decode()
    assert "cannot be loaded" in page
    assert not Agent.objects.exists()


def test_a_flow_agent_and_its_settings_are_saved(admin_client: Client) -> None:
    from mcpregistry.models import McpServer

    # The template calls the default server (PLATFORM_FLOW_DEFAULT_MCP_ID): an agent that could not is refused.
    # Bound: its runs call only the servers the agent binds (a flow calling one it does not bind is refused).
    server = McpServer.objects.create(
        mcp_id="sds-company-data", name="demo", transport="streamable_http", url="http://127.0.0.1:9/mcp"
    )
    response = admin_client.post(
        "/admin/agents/agent/add/",
        agent_post(mode="flow", flow_graph="agents.flows.sequential.build_graph", servers=[str(server.pk)]),
    )
    assert response.status_code == 302
    agent = Agent.objects.get(slug="flowing")
    assert (agent.flow_graph, agent.time_limit_s, agent.answer_from_deterministic) == (
        "agents.flows.sequential.build_graph",
        120,
        True,
    )


def test_the_model_api_key_is_write_only_encrypted_and_audited_by_name_only(admin_client: Client) -> None:
    from audit.models import AuditEvent

    key = "sk-admin-entered-93kd1"
    post = agent_post(
        slug="local-llm",
        model_provider="openai_compatible",
        model_id="llama3.1",
        model_params='{"base_url": "http://127.0.0.1:11434/v1"}',
        new_model_api_key=key,
    )
    response = admin_client.post("/admin/agents/agent/add/", post)
    assert response.status_code == 302, response.content.decode()[:3000]
    agent = Agent.objects.get(slug="local-llm")
    assert agent.model_api_key() == key
    page = admin_client.get(f"/admin/agents/agent/{agent.pk}/change/").content.decode()
    assert key not in page and "set (hidden)" in page
    change = AuditEvent.objects.filter(action="config.agent.create").latest("id")
    assert key not in str(change.args) and key not in str(change.result)
    # An edit that leaves the field empty keeps the key; the clear box removes it.
    admin_client.post(f"/admin/agents/agent/{agent.pk}/change/", {**post, "new_model_api_key": ""})
    agent.refresh_from_db()
    assert agent.model_api_key() == key
    admin_client.post(
        f"/admin/agents/agent/{agent.pk}/change/", {**post, "new_model_api_key": "", "clear_model_api_key": "on"}
    )
    agent.refresh_from_db()
    assert agent.model_secrets == {}


def test_the_audits_mask_is_refused_as_the_model_api_key(admin_client: Client) -> None:
    # "***" pasted from an export or the audit replaced the real key, and the change's audit event read "***" too.
    post = agent_post(
        slug="local-llm",
        model_provider="openai_compatible",
        model_id="llama3.1",
        model_params='{"base_url": "http://127.0.0.1:11434/v1"}',
        new_model_api_key="sk-the-real-key-93kd1",
    )
    assert admin_client.post("/admin/agents/agent/add/", post).status_code == 302
    agent = Agent.objects.get(slug="local-llm")
    for mask in ("***", " ***~2 "):
        page = admin_client.post(f"/admin/agents/agent/{agent.pk}/change/", {**post, "new_model_api_key": mask})
        assert page.status_code == 200
        assert "is how the audit and an export show a secret" in page.content.decode()
        agent.refresh_from_db()
        assert agent.model_api_key() == "sk-the-real-key-93kd1"


def test_the_model_api_key_read_on_the_worker_names_the_variables_it_may_read(admin_client: Client, settings) -> None:
    settings.PLATFORM_MCP_ENV_PASSTHROUGH = ["LOCAL_LLM_KEY"]
    page = admin_client.get("/admin/agents/agent/add/").content.decode()
    assert "The worker variables a binding may read (PLATFORM_MCP_ENV_PASSTHROUGH): LOCAL_LLM_KEY." in page
    post = agent_post(
        slug="local-llm",
        model_provider="openai_compatible",
        model_id="llama3.1",
        model_params='{"base_url": "http://127.0.0.1:11434/v1"}',
        model_api_key_from_env="LOCAL_LLM_KEY",
    )
    response = admin_client.post("/admin/agents/agent/add/", post)
    assert response.status_code == 302, _errors(response.content.decode())
    assert Agent.objects.get(slug="local-llm").model_secrets == {"api_key": {"from_env": "LOCAL_LLM_KEY"}}
    response = admin_client.post(
        "/admin/agents/agent/add/", {**post, "slug": "other", "model_api_key_from_env": "HOME"}
    )
    assert response.status_code == 200  # was a 500: the model's error named a field the form does not have
    assert "errors field-model_api_key_from_env" in response.content.decode()
    assert "HOME: a binding may read only the worker variables named in PLATFORM_MCP_ENV_PASSTHROUGH" in _errors(
        response.content.decode()
    )
    settings.PLATFORM_MCP_ENV_PASSTHROUGH = []
    page = admin_client.get("/admin/agents/agent/add/").content.decode()
    assert "No worker variable may be read: PLATFORM_MCP_ENV_PASSTHROUGH names none." in page


def _errors(page: str) -> str:
    return " ".join(re.findall(r'<ul class="errorlist[^>]*>(.*?)</ul>', page, re.S))


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"model_params": '{"temprature": 0.2}'},
            "&#x27;temprature&#x27; is not a valid key (did you mean &#x27;temperature&#x27;?); the valid keys are: "
            "temperature, max_tokens, top_p, timeout_s",
        ),
        ({"model_params": '{"max_tokens": -5}'}, "max_tokens: must be at least 1"),
        (
            {"model_params": '{"retry": {"attempts": 3}}'},
            "retry.attempts: &#x27;attempts&#x27; is not a valid key (did you mean &#x27;max_attempts&#x27;?); the "
            "valid keys are: max_attempts, on, backoff_s, max_backoff_s",
        ),
        ({"language": "klingon"}, "Choose one of the platform&#x27;s languages: en, ko."),
        ({"max_iterations": "0"}, "At least 1: the model needs one turn to answer."),
        ({"time_limit_s": "0"}, "At least 1 second."),
    ],
)
def test_a_setting_no_run_could_use_is_refused_naming_what_is_valid(
    admin_client: Client, changes: dict[str, str], expected: str
) -> None:
    page = admin_client.post("/admin/agents/agent/add/", agent_post(**changes)).content.decode()
    assert expected in _errors(page), _errors(page)
    assert not Agent.objects.exists()


def test_the_model_parameters_name_their_keys_and_the_language_is_a_choice(admin_client: Client) -> None:
    page = admin_client.get("/admin/agents/agent/add/").content.decode()
    assert "temperature (0–2), max_tokens, top_p" in page
    assert re.search(r'<select name="language"[^>]*>\s*<option value="en">English</option>', page)


def test_nested_model_parameters_are_written_by_their_path(admin_client: Client) -> None:
    """retry, guardrail and flow need no JSON: a line per key by its path, the failure kinds comma-separated."""
    lines = "temperature=0.2\nretry.max_attempts=2\nretry.on=throttled, timeout\nguardrail.id=gr-1\nflow.mcp_id=demo"
    data = agent_post(model_params__editor="1", model_params__lines=lines)
    del data["model_params"]
    assert admin_client.post("/admin/agents/agent/add/", data).status_code == 302
    agent = Agent.objects.get(slug="flowing")
    assert agent.model_params == {
        "temperature": 0.2,
        "retry": {"max_attempts": 2, "on": ["throttled", "timeout"]},
        "guardrail": {"id": "gr-1"},
        "flow": {"mcp_id": "demo"},
    }
    page = admin_client.get(f"/admin/agents/agent/{agent.pk}/change/").content.decode()
    assert f"{lines}</textarea>" in page  # shown back as written
    assert "retry.on (comma-separated: throttled, timeout" in page and "guardrail.trace (enabled" in page

    def refused(text: str) -> str:
        return admin_client.post(
            f"/admin/agents/agent/{agent.pk}/change/", {**data, "model_params__lines": text}
        ).content.decode()

    assert "line 2: retry.max_attempts is given twice" in refused("retry.max_attempts=2\nretry.max_attempts=3")
    assert "retry.on" in refused("retry.on=throttled, sleepy") and "throttled" in refused("retry.on=sleepy")
    assert "retry.attempts" in refused("retry.attempts=3")
    assert Agent.objects.get(pk=agent.pk).model_params["retry"] == {"max_attempts": 2, "on": ["throttled", "timeout"]}


def test_model_parameters_are_key_value_lines(admin_client: Client) -> None:
    """No JSON object to type: KEY=value a line each, values typed as the rule editor types them."""
    from audit.models import AuditEvent

    data = agent_post(model_params__editor="1", model_params__lines='temperature=0.2\n\nretry={"max_attempts": 3}')
    del data["model_params"]
    assert admin_client.post("/admin/agents/agent/add/", data).status_code == 302
    agent = Agent.objects.get(slug="flowing")
    assert agent.model_params == {"temperature": 0.2, "retry": {"max_attempts": 3}}

    page = admin_client.get(f"/admin/agents/agent/{agent.pk}/change/", HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    assert 'name="model_params__lines"' in page and "한 줄에 KEY=value 하나" in page
    assert "temperature=0.2\nretry.max_attempts=3</textarea>" in page  # shown back by its path

    before = AuditEvent.objects.count()
    same = {**data, "model_params__lines": 'temperature=0.2\nretry={"max_attempts": 3}'}
    assert admin_client.post(f"/admin/agents/agent/{agent.pk}/change/", same).status_code == 302
    assert AuditEvent.objects.count() == before  # the same parameters: nothing changed, nothing recorded

    refused = admin_client.post(
        f"/admin/agents/agent/{agent.pk}/change/",
        {**data, "model_params__lines": "temperature=0.3\nmax_tokens 512"},
        HTTP_ACCEPT_LANGUAGE="ko",
    ).content.decode()
    assert "2번째 줄: KEY=value 형식으로 쓰세요" in refused and "max_tokens 512</textarea>" in refused
    assert Agent.objects.get(pk=agent.pk).model_params["temperature"] == 0.2


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{bogus} {query}", "Use only the placeholders {query} and {results}, each written whole (found: {bogus})."),
        ("{results 님", "Use only the placeholders {query} and {results}, each written whole."),
    ],
)
def test_an_offline_answer_template_with_a_placeholder_it_cannot_fill_is_refused(
    admin_client: Client, template: str, expected: str
) -> None:
    """The end user would read it as written: "{bogus} 김하늘 님은 어느 팀 소속인가요?"."""
    page = admin_client.post("/admin/agents/agent/add/", agent_post(answer_template=template)).content.decode()
    errors = " ".join(re.findall(r'<ul class="errorlist[^>]*>(.*?)</ul>', page, re.S))
    assert expected in errors, errors
    assert not Agent.objects.filter(slug="flowing").exists()
    response = admin_client.post("/admin/agents/agent/add/", agent_post(answer_template="{query}: {results}"))
    assert response.status_code == 302


def test_no_model_parameters_are_shown_as_empty_lines_not_a_json_box(admin_client: Client) -> None:
    """``{}`` (nothing set) was shown as a JSON box saying the lines could not show it."""
    assert admin_client.post("/admin/agents/agent/add/", agent_post(model_params="{}")).status_code == 302
    agent = Agent.objects.get(slug="flowing")
    assert agent.model_params == {}
    page = admin_client.get(f"/admin/agents/agent/{agent.pk}/change/").content.decode()
    lines = re.search(r'<textarea name="model_params__lines"[^>]*>(.*?)</textarea>', page, re.S)
    assert lines is not None and lines.group(1).strip() == ""
    assert "these lines cannot show this value" not in page
