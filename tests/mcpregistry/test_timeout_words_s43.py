"""A tool's backend timeout told in Korean, or in the English words other than "timed out", is a timeout.

``classify_tool_error`` knew only "timed out", "deadline exceeded" and 504: a write whose backend said
"원장 시스템 응답 시간 초과" was read as a tool error, so the model was told the write was not done (it may have been)
instead of the approval ending ``outcome_unknown``. The demo server's own "백엔드 응답이 계속 지연됩니다" was missed too.
A quoted argument the tool echoes back is still never read for one. The idempotency key's help texts name the key
a write is sent with (``<run id>:<approval id>``), not "run + call id".
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from mcpregistry import gate
from mcpregistry.contract_form import ToolContractForm
from mcpregistry.contracts import argument_texts, classify_tool_error
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin
from tests.mcp_fixtures.scripts import script_file

SERVER = textwrap.dedent(
    """
    import os
    from fastmcp import FastMCP
    mcp = FastMCP("ko-writes")

    @mcp.tool(annotations={"readOnlyHint": False, "destructiveHint": True})
    def transfer(text: str) -> dict:
        with open(os.environ["WRITES_FILE"], "a", encoding="utf-8") as f:
            f.write(text + "\\n")  # the work is done ...
        return {"error": "원장 시스템 응답 시간 초과", "fallback": "retry"}  # ... and then the backend timed out

    mcp.run(transport="stdio", show_banner=False)
    """
)


@pytest.mark.parametrize(
    "text",
    [
        json.dumps({"error": "원장 시스템 응답 시간 초과", "fallback": "retry"}, ensure_ascii=False),
        "원장 시스템 응답 시간 초과",
        "요청 처리 중 시간초과가 발생했습니다",
        "타임아웃: 결제 서버",
        "에러: 백엔드 응답이 계속 지연됩니다.",
        "백엔드 응답 지연",
        "결제 서버가 응답하지 않습니다",
        "원장 시스템의 응답이 없습니다",
        "the ledger did not respond in time",
        "no response within 30 seconds",
        "408 Request Timeout",
        "upstream: Gateway Timeout",
    ],
)
def test_a_timeout_in_these_words_is_a_timeout(text: str) -> None:
    assert classify_tool_error(text, echoed=argument_texts({"memo": "송금 1건"})) == ("timeout", None)


def test_an_echoed_argument_that_says_timeout_is_no_timeout() -> None:
    args = {"memo": "정산 시간 초과 건"}
    text = "'정산 시간 초과 건' 항목을 찾을 수 없습니다"
    assert classify_tool_error(text, echoed=argument_texts(args)) == ("tool:error", None)
    assert classify_tool_error(text) == ("timeout", None)  # the same words, the tool's own


@pytest.mark.parametrize("text", ["자산을 찾을 수 없습니다", "invalid account number", "잔액이 부족합니다"])
def test_other_errors_stay_tool_errors(text: str) -> None:
    assert classify_tool_error(text) == ("tool:error", None)


@pytest.mark.django_db
@pytest.mark.slow
def test_a_korean_backend_timeout_of_a_write_leaves_its_outcome_unknown(tmp_path: Path) -> None:
    file = tmp_path / "w.txt"
    bound = McpServer.objects.create(
        mcp_id="ko-w",
        name="ko-w",
        command=sys.executable,
        args=[script_file(SERVER)],
        env={"WRITES_FILE": str(file)},
        public_env=["WRITES_FILE"],
        session_scope="shared",
        timeout_s=10,
    )
    assert discover_as_admin(server=bound).ok
    bound = McpServer.objects.prefetch_related("tools__contract").get(pk=bound.pk)
    who = gate.GateCall(source="agent", call_id="c1", writes_blocked=True, write_sandbox=frozenset({"ko-w"}))
    try:
        result = gate.call(server=bound, tool_name="transfer", args={"text": "송금 1건"}, who=who)
    finally:
        get_default_pool().close("ko-w")
    assert file.read_text(encoding="utf-8").splitlines() == ["송금 1건"]  # done once, never sent again
    assert result.error == "approval:outcome_unknown", (result.error, result.message)

    # The contract's page says which key the write is sent with: <run id>:<approval id>, no longer "run + call id".
    contract = ToolContract.objects.get(tool__server=bound, tool__name="transfer")
    for help_text in (
        str(ToolContract._meta.get_field("idempotency_arg").help_text),
        str(ToolContractForm(instance=contract).fields["idempotency_arg"].help_text),
    ):
        assert "<run id>:<approval id>" in help_text and "run + call id" not in help_text
