"""What a change record names for a related row (``str`` of the row a foreign key points to), and what reading it
costs: the "before" snapshot takes the related rows the saved object has already loaded for an unchanged key
(``audit.changes._share_loaded_relations``) instead of reading each again, with whatever its ``__str__`` reads
(a tool's server)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents.models import Agent, DeterministicRule
from audit.changes import audited_save
from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.services import tool_contract_update

pytestmark = pytest.mark.django_db


def _server(mcp_id: str) -> McpServer:
    return McpServer.objects.create(mcp_id=mcp_id, name=mcp_id, transport=McpServer.Transport.LOCAL, args=["x"])


def _contract(server: McpServer, name: str) -> ToolContract:
    tool = McpTool.objects.create(server=server, name=name, description=name)
    return ToolContract.objects.create(tool=tool)


def _last_change(action: str) -> AuditEvent:
    event = AuditEvent.objects.filter(action=action).order_by("-seq").first()
    assert event is not None
    return event


def test_a_contract_update_reads_no_related_row_the_caller_has_loaded() -> None:
    server = _server("crm")
    _contract(server, "lookup")
    contract = ToolContract.objects.select_related("tool__server").get(tool__name="lookup")
    with CaptureQueriesContext(connection) as queries:
        tool_contract_update(contract=contract, actor="test-admin", via="tests", data={"timeout_s": 7.0})
    selects = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]
    # The stored contract (once, for the "before" snapshot) and the validation's own checks (``SELECT 1``: the
    # tool exists); never the tool's or its server's row, which the caller loaded with the contract.
    rows_read = [sql.split(" FROM ")[0] for sql in selects if not sql.startswith("SELECT 1 AS")]
    assert not [s for s in rows_read if '"mcpregistry_mcptool".' in s or '"mcpregistry_mcpserver".' in s], selects
    assert len([s for s in rows_read if '"mcpregistry_toolcontract".' in s]) == 1, selects
    event = _last_change("config.tool_contract.update")
    assert set(event.args) == {"timeout_s"} and event.args["timeout_s"][1] == 7.0, event.args
    assert event.result["name"] == "contract of crm.lookup"


def test_a_renamed_related_row_loaded_before_the_rename_is_not_a_change_of_the_key() -> None:
    server = _server("crm")
    _contract(server, "lookup")
    contract = ToolContract.objects.select_related("tool__server").get(tool__name="lookup")
    # Another path renames the server after this contract (and its tool and server) was loaded.
    McpServer.objects.filter(pk=server.pk).update(mcp_id="crm2")
    tool_contract_update(contract=contract, actor="test-admin", via="tests", data={"timeout_s": 9.0})
    event = _last_change("config.tool_contract.update")
    assert "tool" not in event.args, event.args
    assert set(event.args) == {"timeout_s"}


def test_a_changed_foreign_key_is_recorded_with_both_rows_named() -> None:
    first, second = _server("crm"), _server("erp")
    agent = Agent.objects.create(slug="helper", name="helper", system_prompt="p", model_provider="offline")
    rule = DeterministicRule.objects.create(agent=agent, server=first, name="lookup", tool_name="lookup")
    loaded: Any = DeterministicRule.objects.select_related("server", "agent").get(pk=rule.pk)
    audited_save(loaded, actor="test-admin", via="tests", data={"server": second}, validate=False)
    event = _last_change("config.deterministic_rule.update")
    assert event.args["server"] == ["crm", "erp"]
    # And back, from an object whose loaded server is the new one: the stored row still names the old.
    audited_save(loaded, actor="test-admin", via="tests", data={"server": first}, validate=False)
    assert _last_change("config.deterministic_rule.update").args["server"] == ["erp", "crm"]


def test_an_object_carrying_a_changed_key_records_the_stored_row_s_name_as_before() -> None:
    first, second = _server("crm"), _server("erp")
    agent = Agent.objects.create(slug="helper", name="helper", system_prompt="p", model_provider="offline")
    rule = DeterministicRule.objects.create(agent=agent, server=first, name="lookup", tool_name="lookup")
    # An admin form's instance: the new server is set on it (and loaded) before the save.
    edited: Any = DeterministicRule.objects.select_related("server", "agent").get(pk=rule.pk)
    edited.server = second
    audited_save(edited, actor="test-admin", via="tests", validate=False)
    assert _last_change("config.deterministic_rule.update").args["server"] == ["crm", "erp"]


# --- a JSON value that changes only its type is a change ------------------------------------------------------


def test_a_json_value_that_changes_only_its_type_is_written_and_recorded(demo_agent) -> None:  # type: ignore[no-untyped-def]
    """Python's ``==`` calls ``1``, ``true`` and ``1.0`` equal; JSON, the stored row and the gate's checks do not:
    each change was written and recorded nowhere (the audit's diff compared with ``==``)."""
    from agents.models import DeterministicRule
    from audit.changes import audited_save
    from audit.models import AuditEvent

    rule = DeterministicRule.objects.filter(agent=demo_agent).order_by("order").first()
    assert rule is not None
    audited_save(rule, actor="admin:alice", via="tests", data={"params": {"n": 1}}, validate=False)
    previous: object = 1
    for value in (True, 1.0, 1):
        before = AuditEvent.objects.count()
        audited_save(rule, actor="admin:alice", via="tests", data={"params": {"n": value}}, validate=False)
        events = AuditEvent.objects.order_by("-id")[: AuditEvent.objects.count() - before]
        assert [event.args["params"] for event in events] == [[{"n": previous}, {"n": value}]]
        previous = value
        stored = DeterministicRule.objects.get(pk=rule.pk).params["n"]
        assert (type(stored), stored) == (type(value), value)


def test_the_order_of_a_json_objects_keys_is_no_change_to_record(demo_agent) -> None:  # type: ignore[no-untyped-def]
    from agents.models import DeterministicRule
    from audit.changes import audited_save
    from audit.models import AuditEvent

    rule = DeterministicRule.objects.filter(agent=demo_agent).order_by("order").first()
    assert rule is not None
    audited_save(rule, actor="admin:alice", via="tests", data={"params": {"a": 1, "b": [1, True]}}, validate=False)
    before = AuditEvent.objects.count()
    audited_save(rule, actor="admin:alice", via="tests", data={"params": {"b": [1, True], "a": 1}}, validate=False)
    assert AuditEvent.objects.count() == before
