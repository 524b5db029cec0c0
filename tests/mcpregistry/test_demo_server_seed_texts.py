"""The demo server says what seed 001 says, checked as the seed's ``mcp_verify.py`` checks its server: a real
``sds-company-data`` process over stdio, a ``ClientSession``, ``list_tools`` and ``call_tool``, no model.

Defects held here:

- The seed's fifth failure row ("그 밖의 예외") was missing: an exception other than a rate limit or a timeout
  reached the model as FastMCP's raw English text instead of
  ``에러: 조회 실패 (<exception name>). get_asset_status_backup 도구를 사용하세요.``
- ``FAILURE_TIMEOUT_S`` was read with a bare ``float()`` and never checked: ``abc`` answered Python's
  "could not convert string to float", ``inf`` stalled for ever, ``0`` or a negative number did not stall.
- No test pinned the seed's exact texts: the four lookups' "nothing found" answers, the timeout and rate-limit
  guidance, and each tool's first description line.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

REPO = Path(__file__).resolve().parents[2]
BACKUP_HINT = "get_asset_status_backup 도구를 사용하세요."
# The backend fails with an exception the seed's tool did not expect (its ``except Exception`` row).
UNEXPECTED_BACKEND = (
    "import mcpregistry.demo_server.server as s\n"
    "async def broken(asset_id):\n"
    "    raise KeyError(asset_id)\n"
    "s._call_backend = broken\n"
    "s.main()\n"
)


async def verify(calls: list[tuple[str, dict[str, Any]]], *, env: dict[str, str], code: str = "") -> dict[str, Any]:
    """Start the demo server (or ``code`` that starts it) and return its tools' first description lines and, per
    call in order, ``(is_error, text)``."""
    args = ["-c", code] if code else ["-m", "mcpregistry.demo_server"]
    params = StdioServerParameters(command=sys.executable, args=args, env=env, cwd=str(REPO))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = await session.list_tools()
        answers = []
        for name, arguments in calls:
            result = await session.call_tool(name, arguments)
            answers.append((result.isError, result.content[0].text))  # type: ignore[union-attr]
        return {"tools": {t.name: (t.description or "").splitlines()[0] for t in tools.tools}, "answers": answers}


def verify_all(*servers: Any) -> list[dict[str, Any]]:
    """The servers side by side (each starts in about a second)."""

    async def main() -> list[dict[str, Any]]:
        return list(await asyncio.wait_for(asyncio.gather(*servers), timeout=30))

    return asyncio.run(main())


STATUS = [("get_asset_status", {"asset_id": "A-1001"})]


@pytest.mark.slow
def test_the_demo_server_answers_the_seeds_texts_over_stdio() -> None:
    lookups = [
        ("search_employee", {"name": "홍길동"}),
        ("list_team_members", {"team": "보안팀"}),
        ("get_asset", {"owner": "홍길동"}),
        ("list_projects", {"team": "보안팀"}),
    ]
    healthy, timeout, rate_limit, unexpected = verify_all(
        verify(lookups, env={"FAILURE_MODE": "none"}),
        verify(STATUS, env={"FAILURE_MODE": "timeout", "FAILURE_TIMEOUT_S": "0.05"}),
        verify(STATUS, env={"FAILURE_MODE": "rate_limit"}),
        verify(STATUS, env={"FAILURE_MODE": "none"}, code=UNEXPECTED_BACKEND),
    )

    assert healthy["tools"] == {
        "search_employee": "삼성SDS 임직원 디렉터리에서 이름으로 직원 정보를 조회한다.",
        "list_team_members": "팀 이름으로 소속 임직원 목록을 조회한다.",
        "get_asset": "사내 자산(노트북, 모니터 등)을 조회한다.",
        "list_projects": "진행 중인 프로젝트 목록을 조회한다.",
        "get_asset_status": "자산 관리 백엔드에서 자산 ID로 현재 상태를 실시간 조회한다.",
        "get_asset_status_backup": (
            "백업 자산 상태 조회. get_asset_status 실패 시 사용한다. 1시간 전 스냅샷 기준이라 느리지만 안정적이다."
        ),
        "ping": "서버 응답 확인용. 항상 'pong'을 돌려준다 (지연 측정용, 업무 질문에는 사용하지 않는다).",
    }
    assert healthy["answers"] == [
        (False, "'홍길동' 직원을 찾을 수 없습니다. 등록된 직원: 김하늘, 박도윤, 이서준, 최민준, 정하은"),
        (False, "'보안팀' 팀을 찾을 수 없습니다. 등록된 팀: ['물류플랫폼팀', '클라우드운영팀']"),
        (False, "'홍길동' 사용자의 자산이 없습니다."),
        (False, "'보안팀' 팀의 프로젝트가 없습니다."),
    ]
    # The seed's guidance, after the reason the platform's gate reads first (its retry rules differ by reason).
    assert timeout["answers"] == [(True, f"timeout: 에러: 백엔드 응답이 계속 지연됩니다. {BACKUP_HINT}")]
    assert rate_limit["answers"] == [(True, f"429 rate_limit: 에러: 호출 한도를 초과했습니다. {BACKUP_HINT}")]
    assert unexpected["answers"] == [(True, f"에러: 조회 실패 (KeyError). {BACKUP_HINT}")]


@pytest.mark.slow
def test_a_failure_timeout_that_is_no_positive_number_of_seconds_is_refused_saying_so() -> None:
    stalls = ["abc", "inf", "nan", "0"]
    servers = verify_all(*(verify(STATUS, env={"FAILURE_MODE": "timeout", "FAILURE_TIMEOUT_S": s}) for s in stalls))
    assert [server["answers"] for server in servers] == [
        [(True, f"FAILURE_TIMEOUT_S '{stall}' is not a positive number of seconds")] for stall in stalls
    ]
