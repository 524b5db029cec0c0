"""The gate's plain records, which configuration, agent versions and approvals share with it without loading
the MCP client (``mcpregistry.gate`` imports the session pool and the MCP SDK, which cost a process a second or
two to import; a ``manage.py`` command or a web process that never calls a tool does not pay for them): the state
of a write call's approval, and a tool's contract as the gate applies it (what an agent version freezes)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from mcpregistry.contracts import argument_constraints
from mcpregistry.models import McpTool, ToolContract


@dataclass
class ApprovalState:
    """What the approver knows of a write call: ``pending`` (just asked, or still waiting), ``approved``,
    ``rejected``, ``expired``, ``executed`` (it ran; ``result`` says how), ``executing`` (a worker claimed it
    and did not record how it ended: it died, so the outcome is unknown) or ``outcome_unknown`` (it was sent
    and no answer came; it is never sent again)."""

    status: Literal["pending", "approved", "rejected", "expired", "executing", "executed", "outcome_unknown"]
    approval_id: str
    reason: str = ""
    decided_by: str = ""
    result: dict[str, Any] | None = None
    # The exact arguments the person approved (the call is executed with these) and their hash.
    args: dict[str, Any] | None = None
    call_hash: str = ""


def contract_of(tool: McpTool) -> ToolContract:
    """The tool's contract, or one read off its input schema when an admin has not saved one."""
    try:
        return tool.contract
    except ToolContract.DoesNotExist:
        return ToolContract(tool=tool, args=argument_constraints(tool.input_schema or {}), risk="read")


CONTRACT_FIELDS = (
    "args",
    "unknown_args",
    "returns",
    "retry",
    "timeout_s",
    "fallback_tool",
    "fallback_policy",
    "risk",
    "memo",
    "memo_ttl_s",
    "idempotency_arg",
    "correction_cap",
)


def contract_snapshot(tool: McpTool) -> dict[str, Any]:
    """The contract the gate applies to ``tool`` now, as plain values (what an agent version freezes)."""
    contract = contract_of(tool)
    return {name: getattr(contract, name) for name in CONTRACT_FIELDS}


def contract_from_snapshot(snapshot: Mapping[str, Any]) -> ToolContract:
    """An unsaved contract from ``contract_snapshot``'s values (for ``GateCall.contracts``)."""
    return ToolContract(**{name: snapshot[name] for name in CONTRACT_FIELDS if name in snapshot})
