"""The ``sds-company-data`` FastMCP server from seed 001 (교육용 더미 사내 데이터).

Tools (docstrings are what the model reads, so they say when to use and when not to use each tool):

- ``search_employee(name)``, ``list_team_members(team)``, ``get_asset(owner)``, ``list_projects(team)``:
  the seed's four lookups, with its guiding failure messages.
- ``get_asset_status(asset_id)`` / ``get_asset_status_backup(asset_id)``: the seed's failure-injection pair.
  The backend failure comes from ``FAILURE_MODE`` in this process's environment. Unlike the seed's in-process
  tool, the MCP tool makes one backend attempt per call: retries, timeouts and fallback belong to the
  platform's tool gate, which must see each failure.
- ``ping``: a trivial tool for latency benchmarks.

Nothing is printed to stdout: on stdio that is the protocol channel. Logs go to stderr.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any

from fastmcp import FastMCP
from fastmcp.exceptions import ToolError

DATA_DIR = Path(__file__).resolve().parent / "data"
FAILURE_MODES = ("none", "timeout", "rate_limit", "bad_schema")

logging.basicConfig(
    stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s sds-company-data %(message)s"
)
logger = logging.getLogger("sds-company-data")
# The SDK logs every request at INFO; on stdio that is a line on stderr per call, for nothing.
logging.getLogger("mcp.server.lowlevel.server").setLevel(logging.WARNING)

mcp = FastMCP("sds-company-data")
# Every tool here only reads; the hint lets discovery propose the "read" risk (the admin decides).
READ_ONLY = {"readOnlyHint": True, "destructiveHint": False, "openWorldHint": False}


def _load(filename: str) -> list[dict[str, Any]]:
    with (DATA_DIR / filename).open(encoding="utf-8") as f:
        rows: list[dict[str, Any]] = json.load(f)
    return rows


EMPLOYEES = _load("employees.json")
ASSETS = _load("assets.json")
PROJECTS = _load("projects.json")


def _dumps(value: Any, *, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


@mcp.tool(annotations=READ_ONLY)
def search_employee(name: str) -> str:
    """삼성SDS 임직원 디렉터리에서 이름으로 직원 정보를 조회한다.

    직원의 소속 팀, 직무, 이메일이 필요할 때 사용한다.
    팀 전체 명단이나 인원수에는 사용하지 않는다 (list_team_members 사용).
    자산이나 프로젝트 질문에도 사용하지 않는다 (get_asset, list_projects 사용).

    Args:
        name: 직원의 정확한 한국어 이름
    """
    for emp in EMPLOYEES:
        if emp["name"] == name:
            return _dumps(emp)
    names = ", ".join(e["name"] for e in EMPLOYEES)
    return f"'{name}' 직원을 찾을 수 없습니다. 등록된 직원: {names}"


@mcp.tool(annotations=READ_ONLY)
def list_team_members(team: str) -> str:
    """팀 이름으로 소속 임직원 목록을 조회한다.

    특정 팀의 인원수나 명단이 필요할 때 사용한다.
    개별 직원의 상세 정보는 search_employee를 사용한다.

    Args:
        team: 팀 이름 (예: '클라우드운영팀', '물류플랫폼팀')
    """
    rows = [e for e in EMPLOYEES if e["team"] == team]
    if not rows:
        teams = sorted({e["team"] for e in EMPLOYEES})
        return f"'{team}' 팀을 찾을 수 없습니다. 등록된 팀: {teams}"
    return _dumps({"count": len(rows), "members": rows}, indent=2)


@mcp.tool(annotations=READ_ONLY)
def get_asset(owner: str = "") -> str:
    """사내 자산(노트북, 모니터 등)을 조회한다.

    Args:
        owner: 사용자 이름으로 필터. 빈 문자열이면 전체 자산 반환
    """
    rows = [a for a in ASSETS if not owner or a["owner"] == owner]
    if not rows:
        return f"'{owner}' 사용자의 자산이 없습니다."
    return _dumps({"count": len(rows), "assets": rows}, indent=2)


@mcp.tool(annotations=READ_ONLY)
def list_projects(team: str = "") -> str:
    """진행 중인 프로젝트 목록을 조회한다.

    Args:
        team: 팀 이름으로 필터 (예: '물류플랫폼팀'). 빈 문자열이면 전체
    """
    rows = [p for p in PROJECTS if not team or p["team"] == team]
    if not rows:
        return f"'{team}' 팀의 프로젝트가 없습니다."
    return _dumps(rows, indent=2)


class RateLimitError(Exception):
    """The fake backend's HTTP 429."""


def _failure_mode() -> tuple[str, float]:
    """The injected failure and the stall of ``timeout`` mode (``FAILURE_TIMEOUT_S``, 5 s as in the seed).
    Raises ToolError for a value it does not know, whatever the mode: the seed warns that a typo silently means
    "healthy", and a stall that is no positive number of seconds would fail as Python's own words."""
    mode = os.environ.get("FAILURE_MODE", "none").strip() or "none"
    if mode not in FAILURE_MODES:
        raise ToolError(f"FAILURE_MODE '{mode}' is not one of {', '.join(FAILURE_MODES)}")
    stall = os.environ.get("FAILURE_TIMEOUT_S", "").strip() or "5"
    try:
        stall_s = float(stall)
    except ValueError:
        stall_s = math.nan
    if not (math.isfinite(stall_s) and stall_s > 0):
        raise ToolError(f"FAILURE_TIMEOUT_S '{stall}' is not a positive number of seconds")
    return mode, stall_s


async def _call_backend(asset_id: str) -> dict[str, Any]:
    """가짜 자산 관리 백엔드 호출. FAILURE_MODE에 따라 장애를 재현한다.

    The stall is awaited, not slept: a client that gives up first cancels the request, and only a coroutine stops
    there. A sync tool's thread runs on, and its late answer to a request already cancelled breaks the MCP SDK's
    session (modelcontextprotocol/python-sdk#2416): every later call on it hangs, the backup's included."""
    api_key = os.environ.get("INTERNAL_API_KEY", "")
    # 주의: Secret은 절대 로그에 남기지 않습니다.
    logger.info("backend 호출 asset_id=%s api_key=%s", asset_id, "set" if api_key else "unset")
    mode, stall_s = _failure_mode()
    if mode == "timeout":
        await asyncio.sleep(stall_s)
        raise TimeoutError("backend 응답이 5초를 초과했습니다")
    if mode == "rate_limit":
        raise RateLimitError("429 Too Many Requests: 분당 호출 한도 초과")
    if mode == "bad_schema":
        return {"assetStatus": "사용중인듯"}  # 계약(status, owner 키)과 다른 응답
    for asset in ASSETS:
        if asset["asset_id"] == asset_id:
            return {"asset_id": asset_id, "status": asset["status"], "owner": asset["owner"]}
    return {"asset_id": asset_id, "status": "없음", "owner": None}


@mcp.tool(annotations=READ_ONLY)
async def get_asset_status(asset_id: str) -> dict[str, Any]:
    """자산 관리 백엔드에서 자산 ID로 현재 상태를 실시간 조회한다.

    Args:
        asset_id: 자산 ID (예: 'A-1001')
    """
    try:
        data = await _call_backend(asset_id)
    except RateLimitError as exc:
        logger.warning("rate limit: %s", exc)
        raise ToolError(
            "429 rate_limit: 에러: 호출 한도를 초과했습니다. get_asset_status_backup 도구를 사용하세요."
        ) from exc
    except TimeoutError as exc:
        logger.warning("timeout: %s", exc)
        raise ToolError(
            "timeout: 에러: 백엔드 응답이 계속 지연됩니다. get_asset_status_backup 도구를 사용하세요."
        ) from exc
    except ToolError:
        raise  # a FAILURE_MODE or FAILURE_TIMEOUT_S this server does not know: said as it is
    except Exception as exc:
        # Seed 001's fifth row ("그 밖의 예외"): logged with its traceback, and the model is told the exception's
        # name and the way out, not FastMCP's English text.
        logger.exception("예상 못한 장애")
        raise ToolError(f"에러: 조회 실패 ({type(exc).__name__}). get_asset_status_backup 도구를 사용하세요.") from exc
    if data.get("status") == "없음":
        known = ", ".join(a["asset_id"] for a in ASSETS)
        raise ToolError(f"'{asset_id}' 자산을 찾을 수 없습니다. 등록된 자산: {known}")
    # The backend's answer as it came: in bad_schema mode it lacks status/owner. The tool contract (checked by
    # the platform's gate) catches that, as the seed's in-tool check did.
    return data


@mcp.tool(annotations=READ_ONLY)
def get_asset_status_backup(asset_id: str) -> str:
    """백업 자산 상태 조회. get_asset_status 실패 시 사용한다. 1시간 전 스냅샷 기준이라 느리지만 안정적이다."""
    logger.info("backup 경로 사용 asset_id=%s", asset_id)
    for asset in ASSETS:
        if asset["asset_id"] == asset_id:
            # The seed's A-1004 is in stock, with no owner: said in words, not as Python's None.
            owner = "사용자 없음" if asset["owner"] is None else f"사용자: {asset['owner']}"
            return f"{asset_id}: {asset['status']} ({owner}, 백업 스냅샷 기준, 갱신 주기 1시간)"
    return f"'{asset_id}' 자산을 백업 스냅샷에서 찾을 수 없습니다."


@mcp.tool(annotations=READ_ONLY)
def ping() -> str:
    """서버 응답 확인용. 항상 'pong'을 돌려준다 (지연 측정용, 업무 질문에는 사용하지 않는다)."""
    return "pong"


def main() -> None:
    mcp.run(transport="stdio", show_banner=False)
    # Its client closed stdin (the session's end) and waits for the process to exit: without the collector's last
    # walk over the heap fastmcp's imports made, it exits in a tenth of the time (0.5–2 s before). It holds nothing
    # a finalizer must write out.
    gc.freeze()


if __name__ == "__main__":
    main()
