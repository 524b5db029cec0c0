"""Bad input gets a clear answer, never a traceback or a 500: a configuration file that is not UTF-8 or is nested
past any sense, an export to a place that cannot be written, an archive age past a hundred years, a version
number written with a superscript digit, a Bedrock model given as an ARN, a URL carrying a password."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError

from agents.services import agent_version_publish


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("bad.json", b"\xff\xfe{}", "not UTF-8 text (byte 1)"),
        ("deep.json", b"[" * 100_000, "not valid JSON"),
        ("deep.yaml", b"[" * 100_000, "not valid YAML"),
    ],
)
def test_import_config_names_what_is_wrong_with_the_file(tmp_path: Path, name: str, content: bytes, said: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(CommandError) as refused:
        call_command("import_config", str(path))
    assert said in str(refused.value)


@pytest.mark.django_db
@pytest.mark.parametrize("where", ["/nonexistent/dir/x.json", "/tmp"])
def test_export_config_says_where_it_cannot_write(where: str) -> None:
    with pytest.raises(CommandError) as refused:
        call_command("export_config", "--output", where)
    assert f"cannot write {where}" in str(refused.value)


@pytest.mark.django_db
def test_archive_audit_refuses_an_age_past_a_hundred_years(tmp_path: Path) -> None:
    with pytest.raises(CommandError) as refused:
        call_command("archive_audit", "--older-than-days", "99999999999", "--output", str(tmp_path / "a.jsonl.gz"))
    assert "from 0 to 36500 days" in str(refused.value)


@pytest.mark.django_db
def test_a_version_diff_asked_against_a_superscript_number_falls_back_to_the_previous(admin_client, demo_agent) -> None:
    version = agent_version_publish(agent=demo_agent, actor="t", via="tests")
    page = admin_client.get(f"/admin/agents/agentversion/{version.pk}/diff/", {"against": "²"})
    assert page.status_code == 200


@pytest.mark.django_db
def test_a_bedrock_arn_is_a_form_error_not_a_500(demo_agent) -> None:
    demo_agent.model_provider = "bedrock"
    demo_agent.model_id = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abc123"
    demo_agent.tool_selection = {"force_first_tool": "any"}
    with pytest.raises(ValidationError):  # langchain-aws's own error was a 500
        demo_agent.full_clean()
    demo_agent.tool_selection = {}
    with pytest.raises(ValidationError) as refused:
        demo_agent.full_clean()
    assert "not an ARN" in str(refused.value)


@pytest.mark.django_db
def test_a_url_with_a_password_is_refused_for_a_model_and_a_server(demo_agent) -> None:
    from mcpregistry.models import McpServer

    demo_agent.model_provider = "openai_compatible"
    demo_agent.model_id = "m"
    demo_agent.model_params = {"base_url": "https://proxyuser:Pa55w0rd-gateway@llm.example.com/v1"}
    with pytest.raises(ValidationError) as refused:
        demo_agent.full_clean()
    assert "A URL's user and password are a secret" in str(refused.value)
    server = McpServer(
        mcp_id="with-password", name="p", transport="streamable_http", url="https://u:Pa55w0rd-x@mcp.example.com/mcp"
    )
    with pytest.raises(ValidationError) as refused:
        server.full_clean()
    assert "A URL's user and password are a secret" in str(refused.value)


@pytest.mark.django_db
def test_a_tool_choice_the_model_cannot_honour_is_refused(demo_agent) -> None:
    """Bedrock's Llama models take no forced tool choice: every run failed ``model:error`` when the model was
    asked to call one."""
    demo_agent.model_provider = "bedrock"
    demo_agent.model_id = "meta.llama3-70b-instruct-v1:0"
    demo_agent.model_params = {"tool_choice": "any"}
    with pytest.raises(ValidationError) as refused:
        demo_agent.full_clean()
    assert "tool_choice: the bedrock provider (or this model) cannot be made to call a tool" in str(refused.value)
    demo_agent.model_params = {"tool_choice": "auto"}
    demo_agent.full_clean()
    demo_agent.model_id = "anthropic.claude-3-5-sonnet-20240620-v1:0"
    demo_agent.model_params = {"tool_choice": "any"}
    demo_agent.full_clean()


@pytest.mark.django_db
def test_an_agent_stored_before_these_checks_still_saves_its_other_changes(demo_agent) -> None:
    """An agent stored with a value a later check refuses (a password in its model URL, a Bedrock ARN) still
    saves a change to another field, with its audit event; the refused value is kept as it was."""
    from agents.models import Agent
    from agents.services import agent_update
    from audit.models import AuditEvent

    def prompt_changed_to(prompt: str) -> None:
        before = AuditEvent.objects.count()
        agent_update(agent=demo_agent, actor="t", via="tests", data={"system_prompt": prompt})
        stored = Agent.objects.get(pk=demo_agent.pk)
        assert stored.system_prompt == prompt
        change = AuditEvent.objects.get(id__gt=before, action="config.agent.update")
        assert change.args["system_prompt"][1] == prompt

    stored_url = "https://proxyuser:Pa55w0rd-gateway@llm.example.com/v1"
    Agent.objects.filter(pk=demo_agent.pk).update(
        model_provider="openai_compatible", model_id="m", model_params={"base_url": stored_url}
    )
    demo_agent.refresh_from_db()
    prompt_changed_to("바뀐 프롬프트")
    assert Agent.objects.get(pk=demo_agent.pk).model_params == {"base_url": stored_url}
    arn = "arn:aws:bedrock:us-east-1:1:application-inference-profile/x"
    Agent.objects.filter(pk=demo_agent.pk).update(model_provider="bedrock", model_id=arn, model_params={})
    demo_agent.refresh_from_db()
    prompt_changed_to("또 바뀐 프롬프트")
    assert Agent.objects.get(pk=demo_agent.pk).model_id == arn


@pytest.mark.django_db
def test_a_password_in_a_stdio_servers_hidden_url_is_not_stored(demo_server) -> None:
    """The page hides the URL of a stdio server: one typed for another transport and left there was saved with its
    password, and exported in clear."""
    from mcpregistry.services import mcp_server_update

    mcp_server_update(
        server=demo_server, actor="t", via="tests", data={"url": "https://bob:hunter2@mcp.example.com/mcp"}
    )
    demo_server.refresh_from_db()
    assert demo_server.url == ""


@pytest.mark.django_db
def test_a_version_diff_says_when_there_is_nothing_to_compare(admin_client, demo_agent) -> None:
    """It said "The two versions have the same content." against a version that does not exist, or for v1."""
    first = agent_version_publish(agent=demo_agent, actor="t", via="tests")
    page = admin_client.get(f"/admin/agents/agentversion/{first.pk}/diff/").content.decode()
    assert "v1 is the first version" in page and "same content" not in page
    page = admin_client.get(f"/admin/agents/agentversion/{first.pk}/diff/", {"against": "7"}).content.decode()
    assert "company-assistant has no version 7; its versions: v1." in page and "same content" not in page


@pytest.mark.django_db
def test_a_stdio_servers_hidden_url_that_is_no_url_is_a_field_error(demo_server) -> None:
    from mcpregistry.services import mcp_server_update

    with pytest.raises(ValidationError) as refused:  # not urlparse's ValueError
        mcp_server_update(server=demo_server, actor="t", via="tests", data={"url": "http://[x"})
    assert "url" in refused.value.message_dict
