"""Other agents call ours over A2A and MCP, with clients we did not write: the official ``a2a-sdk`` client and the
``mcp`` SDK's client, against the running platform (uvicorn serving the ASGI app, as ``bin/up`` does, a Celery
worker, the demo MCP server and a write tool that needs approval). Only the model is scripted."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, A2AClientError, ClientConfig, create_client
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError, UnsupportedOperationError
from google.protobuf import json_format, struct_pb2

from tests.e2e.harness import ROOT, RunningPlatform, _stop, free_port, running_platform, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

WRITES_A_NOTE = [
    {"tool_calls": [{"name": "append_note", "args": {"text": "회의록 저장"}}]},
    {"content": "결과: {last_tool_result}"},
]
SLOW_LOOKUPS = [
    {"tool_calls": [{"name": "search_employee", "args": {"name": "김하늘"}}]},
    {"tool_calls": [{"name": "search_employee", "args": {"name": "이서준"}}]},
    {"tool_calls": [{"name": "search_employee", "args": {"name": "박지민"}}]},
    {"content": "끝: {last_tool_result}"},
]


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningPlatform, Path, str]]:
    workdir = tmp_path_factory.mktemp("protocols")
    notes = workdir / "notes.txt"
    config = {
        "servers": [
            {
                "mcp_id": "notes",
                "transport": "stdio",
                "command": sys.executable,
                "args": ["-m", "tests.mcp_fixtures.probe_server"],
                "cwd": str(ROOT),
                "env": {"NOTES_FILE": {"value": str(notes)}},
                "public_env": ["NOTES_FILE"],
                "session_scope": "shared",
            }
        ],
        "agents": [
            {
                "slug": "notes",
                "name": "Notes",
                "system_prompt": "Writes meeting notes.",
                "model": {"provider": "scripted", "params": {"script": WRITES_A_NOTE}},
                "servers": ["notes"],
                "caller_approves_model_writes": True,
            },
            {
                # For the cancellations: 2 s a model call leaves seconds between a call seen and the next one.
                "slug": "slow",
                "name": "Slow",
                "system_prompt": "Looks people up, slowly.",
                "model": {"provider": "scripted", "params": {"script": SLOW_LOOKUPS, "latency_s": 2}},
                "servers": ["sds-company-data"],
            },
            {
                # For the progress reports: the same lookups, each model call taking its time too (so that each
                # tool call ends at its own moment, while the stream is open), but a quarter of the slow one's.
                "slug": "steady",
                "name": "Steady",
                "system_prompt": "Looks people up, one at a time.",
                "model": {"provider": "scripted", "params": {"script": SLOW_LOOKUPS, "latency_s": 0.5}},
                "servers": ["sds-company-data"],
            },
        ],
    }
    path = workdir / "config.json"
    path.write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    with running_platform(workdir, config=path, discover=("notes",), asgi=True) as running:
        scoped = running.manage("create_api_key", "scoped", "--agents", "notes").strip().splitlines()[-1]
        yield running, notes, scoped


def http(api_key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(headers={"Authorization": f"Bearer {api_key}"}, timeout=90)


def user_message(
    text: str = "", *, data: dict[str, Any] | None = None, task_id: str = "", context_id: str = ""
) -> Message:
    message = Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()), task_id=task_id, context_id=context_id)
    if text:
        message.parts.append(Part(text=text))
    if data is not None:
        value = struct_pb2.Value()
        json_format.ParseDict(data, value)
        message.parts.append(Part(data=value))
    return message


async def collect(stream: Any) -> list[StreamResponse]:
    return [event async for event in stream]


def the_task(events: list[StreamResponse]) -> Task:
    [event] = events
    assert event.HasField("task")
    return event.task


# --- A2A -------------------------------------------------------------------------------------------------


def test_the_a2a_client_discovers_each_agent_by_its_card_and_the_key_sees_only_its_agents(platform) -> None:  # type: ignore[no-untyped-def]
    running, _notes, scoped = platform

    async def scenario() -> None:
        async with http(running.api_key) as client:
            card = await A2ACardResolver(client, f"{running.base_url}/a2a/company-assistant/").get_agent_card()
            assert card.name
            assert card.capabilities.streaming
            [interface] = card.supported_interfaces
            assert interface.url == f"{running.base_url}/a2a/company-assistant/"
            assert (interface.protocol_binding, interface.protocol_version) == ("JSONRPC", "1.0")
            assert card.security_schemes["apiKey"].http_auth_security_scheme.scheme == "bearer"
            assert any("search_employee" in skill.name for skill in card.skills)
            directory = await A2ACardResolver(client, running.base_url).get_agent_card()
            assert {"company-assistant", "notes", "slow"} <= {skill.id for skill in directory.skills}
            # A card names its interfaces (the SDK connects to the first): the directory, each agent's endpoint.
            assert f"{running.base_url}/a2a/notes/" in {i.url for i in directory.supported_interfaces}
        async with http(scoped) as client:
            # A key with one agent: the domain's card is that agent's.
            directory = await A2ACardResolver(client, running.base_url).get_agent_card()
            assert [i.url for i in directory.supported_interfaces] == [f"{running.base_url}/a2a/notes/"]
            response = await client.get(f"{running.base_url}/a2a/company-assistant/.well-known/agent-card.json")
            assert response.status_code == 404
            assert response.json()["error"]["code"] == "agent_not_found"

    asyncio.run(scenario())


def test_a_message_becomes_a_run_and_get_task_reads_it_back(platform) -> None:  # type: ignore[no-untyped-def]
    running, _notes, _scoped = platform

    async def scenario() -> None:
        async with http(running.api_key) as httpx_client:
            config = ClientConfig(httpx_client=httpx_client, streaming=False)
            client = await create_client(f"{running.base_url}/a2a/company-assistant/", client_config=config)
            message = user_message(
                "김하늘 님은 어느 팀 소속인가요?", data={"order": {"id": "O-1"}}, context_id="conv-1"
            )
            task = the_task(await collect(client.send_message(SendMessageRequest(message=message))))
            assert task.status.state == TaskState.TASK_STATE_COMPLETED, task
            assert task.context_id == "conv-1"
            answer = task.artifacts[0].parts[0].text
            assert "김하늘" in answer
            got = await client.get_task(GetTaskRequest(id=task.id))
            assert got.status.state == TaskState.TASK_STATE_COMPLETED
            assert got.artifacts[0].parts[0].text == answer
            # The task is the run: the REST API shows the same run, with the data part as a2a_data.
            run = (await httpx_client.get(f"{running.base_url}/api/v1/runs/{task.id}")).json()
            assert (run["status"], run["answer"], run["a2a_data"]) == ("succeeded", answer, [{"order": {"id": "O-1"}}])
            assert run["context"]["contextId"] == "conv-1"
            assert any(call["name"] == "search_employee" for call in run["tool_calls"])
            # The same message again (same messageId) is the same task, not a second run.
            again = the_task(await collect(client.send_message(SendMessageRequest(message=message))))
            assert again.id == task.id
            with pytest.raises(TaskNotFoundError):
                await client.get_task(GetTaskRequest(id=str(uuid.uuid4())))
            with pytest.raises(TaskNotCancelableError):
                await client.cancel_task(CancelTaskRequest(id=task.id))
            await client.close()

    asyncio.run(scenario())


def test_a_streamed_message_reports_status_and_tool_calls_until_the_answer(platform) -> None:  # type: ignore[no-untyped-def]
    running, _notes, _scoped = platform

    async def scenario() -> None:
        async with http(running.api_key) as httpx_client:
            client = await create_client(
                f"{running.base_url}/a2a/steady/", client_config=ClientConfig(httpx_client=httpx_client, streaming=True)
            )
            events = await collect(client.send_message(SendMessageRequest(message=user_message("누구인가요?"))))
            assert events[0].HasField("task")
            # The task as it stood when the stream began: still queued, or already taken by the worker.
            assert events[0].task.status.state in {TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING}
            updates = [e.status_update for e in events if e.HasField("status_update")]
            tool_updates = [
                u for u in updates if u.status.message.parts and "search_employee" in u.status.message.parts[0].text
            ]
            assert len(tool_updates) == 3
            # Each call's update carries when that call ended (each model call takes its time), not the run's end.
            stamps = [u.status.timestamp.ToDatetime() for u in tool_updates]
            assert stamps == sorted(stamps) and len(set(stamps)) == 3
            assert stamps[-1] <= updates[-1].status.timestamp.ToDatetime()
            assert any(u.status.state == TaskState.TASK_STATE_WORKING for u in updates)
            [artifact] = [e.artifact_update for e in events if e.HasField("artifact_update")]
            assert artifact.artifact.parts[0].text.startswith("끝:")
            assert updates[-1].status.state == TaskState.TASK_STATE_COMPLETED
            await client.close()

    asyncio.run(scenario())


def test_a_task_is_cancelled_and_a_resubscribed_stream_follows_it_to_the_end(platform) -> None:  # type: ignore[no-untyped-def]
    running, _notes, _scoped = platform

    async def scenario() -> None:
        async with http(running.api_key) as httpx_client:
            config = ClientConfig(httpx_client=httpx_client, streaming=False, polling=True)
            client = await create_client(f"{running.base_url}/a2a/slow/", client_config=config)
            task = the_task(await collect(client.send_message(SendMessageRequest(message=user_message("누구?")))))
            assert task.status.state in {TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING}
            streaming = await create_client(
                f"{running.base_url}/a2a/slow/", client_config=ClientConfig(httpx_client=httpx_client, streaming=True)
            )
            subscription = asyncio.ensure_future(collect(streaming.subscribe(SubscribeToTaskRequest(id=task.id))))
            for _ in range(200):  # until the worker has made at least one tool call
                run = (await httpx_client.get(f"{running.base_url}/api/v1/runs/{task.id}")).json()
                if run["tool_calls"]:
                    break
                await asyncio.sleep(0.2)
            cancelled = await client.cancel_task(CancelTaskRequest(id=task.id))
            assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
            events = await asyncio.wait_for(subscription, timeout=60)
            assert events[0].HasField("task")
            assert events[-1].status_update.status.state == TaskState.TASK_STATE_CANCELED
            got = await client.get_task(GetTaskRequest(id=task.id))
            assert got.status.state == TaskState.TASK_STATE_CANCELED
            assert len(got.metadata["toolCalls"]) < 3  # it stopped before its script ended
            await client.close()

    asyncio.run(scenario())


def test_an_approval_round_trip_goes_through_input_required(platform) -> None:  # type: ignore[no-untyped-def]
    running, notes, scoped = platform

    async def scenario() -> None:
        async with http(scoped) as httpx_client:
            client = await create_client(
                f"{running.base_url}/a2a/notes/", client_config=ClientConfig(httpx_client=httpx_client, streaming=False)
            )
            task = the_task(
                await collect(client.send_message(SendMessageRequest(message=user_message("회의록을 저장해줘"))))
            )
            assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, task
            approvals = json_format.MessageToDict(task.status.message.parts[1].data)["approvals"]
            assert [(a["tool"], a["args"]) for a in approvals] == [("append_note", {"text": "회의록 저장"})]
            assert not notes.exists() or notes.read_text() == ""
            decision = {"decision": "approve", "approvalId": approvals[0]["approvalId"], "reason": "확인"}
            reply = user_message(data=decision, task_id=task.id, context_id=task.context_id)
            done = the_task(await collect(client.send_message(SendMessageRequest(message=reply))))
            assert done.id == task.id
            assert done.status.state == TaskState.TASK_STATE_COMPLETED, done
            assert done.artifacts[0].parts[0].text == '결과: <tool_data>\n"notes: 1"\n</tool_data>'
            assert notes.read_text(encoding="utf-8").startswith("회의록 저장\t")
            # A finished task takes no more input.
            with pytest.raises(UnsupportedOperationError, match="finished"):
                await collect(client.send_message(SendMessageRequest(message=user_message("approve", task_id=task.id))))
            await client.close()

    asyncio.run(scenario())


def test_a2a_without_a_valid_key_is_refused(platform) -> None:  # type: ignore[no-untyped-def]
    running, _notes, scoped = platform

    async def scenario() -> None:
        async with http("apk_not-a-real-key") as client:
            with pytest.raises(Exception, match="401"):
                await create_client(f"{running.base_url}/a2a/notes/", client_config=ClientConfig(httpx_client=client))
        # A key scoped to other agents cannot reach this one, even with its card in hand.
        async with http(running.api_key) as client:
            card = await A2ACardResolver(client, f"{running.base_url}/a2a/slow/").get_agent_card()
        async with http(scoped) as client:
            a2a = await create_client(card, client_config=ClientConfig(httpx_client=client, streaming=False))
            with pytest.raises(A2AClientError, match="404"):
                await collect(a2a.send_message(SendMessageRequest(message=user_message("누구?"))))
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(
                f"{running.base_url}/a2a/notes/", json={"jsonrpc": "2.0", "id": 1, "method": "GetTask"}
            )
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "not_authenticated"

    asyncio.run(scenario())


# --- MCP -------------------------------------------------------------------------------------------------


def mcp_session(running: RunningPlatform, api_key: str):  # type: ignore[no-untyped-def]
    from mcp.client.streamable_http import streamable_http_client

    return streamable_http_client(f"{running.base_url}/mcp/", http_client=http(api_key))


def test_the_mcp_client_sees_the_agents_as_tools_and_asks_one_with_progress(platform) -> None:  # type: ignore[no-untyped-def]
    from mcp import ClientSession

    running, _notes, scoped = platform
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    async def scenario() -> None:
        async with mcp_session(running, scoped) as (read, write, _), ClientSession(read, write) as session:
            await session.initialize()
            assert [tool.name for tool in (await session.list_tools()).tools] == ["ask_notes"]
        async with mcp_session(running, running.api_key) as (read, write, _), ClientSession(read, write) as session:
            await session.initialize()
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            assert {"ask_company-assistant", "ask_notes", "ask_slow", "ask_steady"} <= set(tools)
            assert tools["ask_slow"].inputSchema["required"] == ["query"]
            assert tools["ask_steady"].inputSchema["required"] == ["query"]
            result = await session.call_tool("ask_steady", {"query": "누구인가요?"}, progress_callback=on_progress)
            assert not result.isError
            assert result.content[0].text.startswith("끝:")
            structured = result.structuredContent
            assert structured["status"] == "succeeded"
            assert [call["name"] for call in structured["tool_calls"]] == ["search_employee"] * 3
            assert structured["approvals_pending"] == []
            messages = [m for _v, m in progress]
            assert sum("search_employee" in (m or "") for m in messages) == 3
            assert [v for v, _m in progress] == sorted(v for v, _m in progress)
            # The tool's run is a run like any other.
            async with http(running.api_key) as client:
                run = (await client.get(f"{running.base_url}/api/v1/runs/{structured['run_id']}")).json()
            assert (run["agent"], run["query"], run["status"]) == ("steady", "누구인가요?", "succeeded")
            # Bad arguments are a tool error, not a failed request.
            bad = await session.call_tool("ask_slow", {"query": ""})
            assert bad.isError and "invalid_input" in bad.content[0].text

    asyncio.run(scenario())


def test_an_mcp_call_that_needs_approval_answers_with_the_pending_approval(platform) -> None:  # type: ignore[no-untyped-def]
    from mcp import ClientSession

    running, _notes, scoped = platform

    async def scenario() -> None:
        async with mcp_session(running, scoped) as (read, write, _), ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool("ask_notes", {"query": "메모 남겨줘", "context": {"userId": "E-1"}})
            structured = result.structuredContent
            assert structured["status"] == "awaiting_approval"
            [pending] = structured["approvals_pending"]
            assert (pending["tool"], pending["args"]) == ("append_note", {"text": "회의록 저장"})
            assert "awaiting approval" in result.content[0].text
        async with http(scoped) as client:  # leave nothing parked for the other tests
            await client.post(f"{running.base_url}/api/v1/runs/{structured['run_id']}/cancel")

    asyncio.run(scenario())


def _sse_messages(lines: Any) -> Any:
    for line in lines:
        if line.startswith("data: "):
            yield json.loads(line[len("data: ") :])


def test_cancelling_an_mcp_call_cancels_its_run(platform) -> None:  # type: ignore[no-untyped-def]
    running, _notes, _scoped = platform
    headers = {
        "Authorization": f"Bearer {running.api_key}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-06-18",
    }
    url = f"{running.base_url}/mcp/"
    with httpx.Client(headers=headers, timeout=90) as client:
        init = client.post(
            url,
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "t", "version": "1"},
                },
            },
        )
        assert init.json()["result"]["protocolVersion"] == "2025-06-18"
        session = {"Mcp-Session-Id": init.headers["Mcp-Session-Id"]}
        call = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": "ask_slow", "arguments": {"query": "누구?"}, "_meta": {"progressToken": "p1"}},
        }
        with client.stream("POST", url, json=call, headers=session) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            messages = _sse_messages(response.iter_lines())
            first = next(messages)
            assert first["method"] == "notifications/progress"
            cancel = {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": 7, "reason": "user"},
            }
            assert client.post(url, json=cancel, headers=session).status_code == 202
            # The stream ends without an answer to the cancelled request (MCP: its receiver should not answer it).
            assert [m for m in messages if "id" in m] == []
        newest = client.get(f"{running.base_url}/api/v1/runs", params={"agent": "slow", "page_size": 1}).json()
        run = newest["results"][0]
        assert (run["status"], run["query"]) == ("cancelled", "누구?")


def test_mcp_without_a_valid_key_is_refused(platform) -> None:  # type: ignore[no-untyped-def]
    running, _notes, _scoped = platform
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    response = httpx.post(f"{running.base_url}/mcp/", json=body, timeout=30)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    bad = httpx.post(f"{running.base_url}/mcp/", json=body, headers={"Authorization": "Bearer apk_nope"}, timeout=30)
    assert (bad.status_code, bad.json()["error"]["code"]) == (401, "authentication_failed")


@pytest.mark.thirdparty
def test_the_mcp_inspector_cli_lists_and_calls_an_agent(platform, request) -> None:  # type: ignore[no-untyped-def]
    from tests.thirdparty import Progress, install_inspector

    running, _notes, scoped = platform
    inspector = install_inspector(Progress(request.config))
    common = [f"{running.base_url}/mcp/", "--transport", "http", "--header", f"Authorization: Bearer {scoped}"]

    def inspect(*args: str) -> Any:
        done = subprocess.run(inspector.argv(*common, *args), capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)

    listed = inspect("--method", "tools/list")
    assert [tool["name"] for tool in listed["tools"]] == ["ask_notes"]
    called = inspect("--method", "tools/call", "--tool-name", "ask_notes", "--tool-arg", "query=메모 남겨줘")
    structured = called["structuredContent"]
    assert structured["status"] == "awaiting_approval"
    assert structured["approvals_pending"][0]["tool"] == "append_note"
    httpx.post(
        f"{running.base_url}/api/v1/runs/{structured['run_id']}/cancel",
        headers={"Authorization": f"Bearer {scoped}"},
        timeout=30,
    )
    refused = subprocess.run(
        inspector.argv(f"{running.base_url}/mcp/", "--transport", "http", "--method", "tools/list"),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert refused.returncode != 0
    assert "not_authenticated" in refused.stdout + refused.stderr


def test_an_mcp_client_that_goes_away_mid_call_cancels_its_run(platform) -> None:  # type: ignore[no-untyped-def]
    running, _notes, _scoped = platform
    headers = {"Authorization": f"Bearer {running.api_key}", "Accept": "application/json, text/event-stream"}
    url = f"{running.base_url}/mcp/"
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "ask_slow", "arguments": {"query": "누구?"}, "_meta": {"progressToken": 1}},
    }
    with httpx.Client(headers=headers, timeout=90) as client:
        with client.stream("POST", url, json=call) as response:
            first = next(_sse_messages(response.iter_lines()))
            assert first["method"] == "notifications/progress"
        # The connection is closed before the answer: the run is cancelled (it would take ~8 s otherwise).
        runs = client.get(f"{running.base_url}/api/v1/runs", params={"agent": "slow", "page_size": 1}).json()
        run_id = runs["results"][0]["id"]
        wait_until(
            lambda: client.get(f"{running.base_url}/api/v1/runs/{run_id}").json()["status"] == "cancelled",
            timeout=30,
            what="the abandoned call's run to be cancelled",
        )
        run = client.get(f"{running.base_url}/api/v1/runs/{run_id}").json()
        assert "client gone" in run["error"]["message"]
        assert len(run["tool_calls"]) < 3


@contextlib.contextmanager
def runserver_beside(running: RunningPlatform) -> Iterator[RunningPlatform]:
    """``runserver`` on the module's platform: its database, its var/ folder (so its embedded broker, which the
    platform's worker consumes) and its key, in the environment ``running_platform`` gives its own web server.
    A second web server, not a second platform: the worker and the seeded database are the module's."""
    workdir = running.db_path.parent
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL"}}
    env.update(
        PLATFORM_VAR_DIR=str(workdir / "var"),
        SQLITE_PATH=str(running.db_path),
        DJANGO_SETTINGS_MODULE="agent_platform.settings",
        DEMO_ADMIN_PASSWORD="e2e-admin-password",
        PYTHONUNBUFFERED="1",
    )
    port = free_port()
    with (running.logs / "runserver.log").open("wb") as log:
        server = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        base_url = f"http://127.0.0.1:{port}"
        try:
            wait_until(
                lambda: httpx.get(f"{base_url}/healthz", timeout=2).status_code == 200, timeout=60, what="runserver"
            )
            yield dataclasses.replace(running, base_url=base_url)
        finally:
            _stop(server)


def test_both_protocols_also_stream_under_runserver(platform) -> None:  # type: ignore[no-untyped-def]
    """``runserver`` (WSGI) serves the same views; their streams then come from plain generators."""
    from mcp import ClientSession

    progress: list[str | None] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message)

    async def scenario(running: RunningPlatform) -> None:
        async with http(running.api_key) as httpx_client:
            client = await create_client(
                f"{running.base_url}/a2a/company-assistant/",
                client_config=ClientConfig(httpx_client=httpx_client, streaming=True),
            )
            events = await collect(
                client.send_message(SendMessageRequest(message=user_message("김하늘 님은 어느 팀 소속인가요?")))
            )
            assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
            [artifact] = [e.artifact_update for e in events if e.HasField("artifact_update")]
            assert "김하늘" in artifact.artifact.parts[0].text
            await client.close()
        async with mcp_session(running, running.api_key) as (read, write, _), ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool(
                "ask_company-assistant", {"query": "김하늘 님은 어느 팀 소속인가요?"}, progress_callback=on_progress
            )
            assert result.structuredContent["status"] == "succeeded"
            assert any("search_employee" in (m or "") for m in progress)

    with runserver_beside(platform[0]) as running:
        asyncio.run(scenario(running))
