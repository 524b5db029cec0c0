"""GET /runs/{id}/events: server-sent events, replayed from Last-Event-ID (or ?after=) and followed until the run
finishes. In-process for the protocol's details; end to end with a real HTTP client against uvicorn (ASGI)
while a Celery worker executes the run in another process."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from django.test import Client

from agents.api.events import RunEventFeed
from agents.models import Run, RunEvent
from tests.e2e.harness import ROOT, _stop, free_port, manage_in, seeded, wait_until

URL = "/api/v1/runs"


@dataclass
class ServerSentEvent:
    id: str | None
    event: str
    data: str

    @property
    def json(self) -> dict:
        return json.loads(self.data)


def parse_stream(text: str) -> tuple[list[ServerSentEvent], list[str]]:
    """The events and the comment lines of an SSE stream."""
    events: list[ServerSentEvent] = []
    comments: list[str] = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                comments.append(line[1:].strip())
            elif line:
                name, _, value = line.partition(":")
                fields[name] = value[1:] if value.startswith(" ") else value
        if "data" in fields:
            events.append(
                ServerSentEvent(id=fields.get("id"), event=fields.get("event", "message"), data=fields["data"])
            )
    return events, comments


# --- in process ---------------------------------------------------------------------------------------------


@pytest.fixture
def finished_run(db, demo_agent, api_caller) -> Run:  # type: ignore[no-untyped-def]
    run = Run.objects.create(agent=demo_agent, api_key=api_caller[0], query="q", status=Run.Status.SUCCEEDED)
    for seq, (kind, data) in enumerate(
        [
            ("status", {"status": "running"}),
            ("rule", {"rule": "직원 소속 조회", "matched": True}),
            ("deterministic_result", {"tool": "search_employee", "value": {"team": "클라우드운영팀"}}),
            ("status", {"status": "succeeded", "answer": "클라우드운영팀입니다."}),
        ],
        start=1,
    ):
        RunEvent.objects.create(run=run, seq=seq, kind=kind, data=data)
    return run


def stream_of(client: Client, path: str, **headers: str) -> tuple[object, str]:
    response = client.get(path, **headers)
    assert response.status_code == 200, response.content
    return response, b"".join(response.streaming_content).decode()


@pytest.fixture
def sse_client(api_caller) -> Client:  # type: ignore[no-untyped-def]
    return Client(HTTP_AUTHORIZATION=f"Bearer {api_caller[1]}")


def test_a_finished_runs_events_are_replayed_then_the_stream_ends(sse_client, finished_run) -> None:
    response, text = stream_of(sse_client, f"{URL}/{finished_run.id}/events")
    assert response["Content-Type"].startswith("text/event-stream")
    assert response["Cache-Control"] == "no-cache"
    assert response["X-Accel-Buffering"] == "no"
    events, _ = parse_stream(text)
    assert [(e.id, e.event) for e in events] == [
        ("1", "status"),
        ("2", "rule"),
        ("3", "deterministic_result"),
        ("4", "status"),
        (None, "end"),
    ]
    assert events[-1].json == {"status": "succeeded"}
    assert events[2].json["value"]["team"] == "클라우드운영팀"
    assert "클라우드운영팀" in text  # JSON without \u escapes
    assert text.startswith("retry: ")


def test_last_event_id_resumes_after_that_event(sse_client, finished_run) -> None:
    _, text = stream_of(sse_client, f"{URL}/{finished_run.id}/events", HTTP_LAST_EVENT_ID="2")
    assert [e.id for e in parse_stream(text)[0]] == ["3", "4", None]


def test_after_resumes_after_that_event_and_last_event_id_wins(sse_client, finished_run) -> None:
    _, text = stream_of(sse_client, f"{URL}/{finished_run.id}/events?after=3")
    assert [e.id for e in parse_stream(text)[0]] == ["4", None]
    _, text = stream_of(sse_client, f"{URL}/{finished_run.id}/events?after=1", HTTP_LAST_EVENT_ID="3")
    assert [e.id for e in parse_stream(text)[0]] == ["4", None]


@pytest.mark.parametrize(
    ("query", "headers", "field"),
    [
        ("?after=x", {}, "after"),
        ("", {"HTTP_LAST_EVENT_ID": "-1"}, "Last-Event-ID"),
        # More digits than Python reads (4,300): a 500 before; more than any event number, already a 400.
        ("", {"HTTP_LAST_EVENT_ID": "9" * 4301}, "Last-Event-ID"),
        ("?after=" + "9" * 19, {}, "after"),
    ],
)
def test_a_bad_position_is_a_400(sse_client, finished_run, query, headers, field) -> None:
    response = sse_client.get(f"{URL}/{finished_run.id}/events{query}", **headers)
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_another_method_is_a_405_naming_get_head_and_options_not_a_csrf_refusal(
    sse_client, finished_run, method: str
) -> None:
    response = getattr(
        Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=sse_client.defaults["HTTP_AUTHORIZATION"]), method
    )(f"{URL}/{finished_run.id}/events")
    assert response.status_code == 405 and response["Allow"] == "GET, HEAD, OPTIONS"
    assert response.json()["error"]["code"] == "method_not_allowed"


def test_no_key_is_a_401_with_a_bearer_challenge(finished_run) -> None:
    response = Client().get(f"{URL}/{finished_run.id}/events")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_wrong_key_is_a_401(finished_run) -> None:
    response = Client(HTTP_AUTHORIZATION="Bearer apk_wrong").get(f"{URL}/{finished_run.id}/events")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"


def test_another_callers_run_is_a_404(finished_run, other_caller) -> None:
    response = Client(HTTP_AUTHORIZATION=f"Bearer {other_caller.raw_key}").get(f"{URL}/{finished_run.id}/events")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "run_not_found"


def test_a_post_is_a_405(sse_client, finished_run) -> None:
    response = sse_client.post(f"{URL}/{finished_run.id}/events")
    assert response.status_code == 405
    assert response["Allow"] == "GET, HEAD, OPTIONS"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_silence_gets_a_keep_alive_comment_and_the_stream_closes_at_its_max_duration(finished_run) -> None:
    Run.objects.filter(pk=finished_run.pk).update(status=Run.Status.RUNNING)
    clock = FakeClock()
    feed = RunEventFeed(run_id=finished_run.pk, after=4, poll_s=0.5, keepalive_s=15, max_s=60, clock=clock)
    assert feed.poll() == ([], "wait")
    clock.now += 15
    assert feed.poll() == ([": keep-alive\n\n"], "wait")
    clock.now += 5
    assert feed.poll() == ([], "wait")
    RunEvent.objects.create(run=finished_run, seq=5, kind="model_turn", data={"content": "생각 중"})
    chunks, state = feed.poll()
    assert (chunks, state) == (['id: 5\nevent: model_turn\ndata: {"content":"생각 중"}\n\n'], "wait")
    clock.now += 40
    chunks, state = feed.poll()
    assert state == "done"
    assert chunks[-1].startswith(": open too long")  # no `end`: the run has not finished, the client reconnects


def test_a_long_backlog_is_sent_in_batches_without_waiting(finished_run, monkeypatch) -> None:
    monkeypatch.setattr("agents.api.events.BATCH", 3)
    feed = RunEventFeed(run_id=finished_run.pk, after=0, poll_s=0.5, keepalive_s=15, max_s=60)
    assert feed.poll()[1] == "more"
    chunks, state = feed.poll()
    assert state == "done"
    assert chunks[-1].startswith("event: end")


# --- end to end: uvicorn + a Celery worker ------------------------------------------------------------------


@dataclass
class AsgiPlatform:
    base_url: str
    api_key: str
    env: dict[str, str]
    workdir: Path

    def client(self, **kwargs) -> httpx.Client:  # type: ignore[no-untyped-def]
        return httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {self.api_key}"}, **kwargs)

    @contextlib.contextmanager
    def worker(self) -> Iterator[subprocess.Popen[bytes]]:
        log = (self.workdir / "worker.log").open("wb")
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", "agent_platform", "worker", "--pool=solo"),
                *("--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat"),
            ],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield process
        finally:
            _stop(process)
            log.close()


@contextlib.contextmanager
def asgi_platform(workdir: Path, *, collect_static: bool = False, **extra_env: str) -> Iterator[AsgiPlatform]:
    """The platform as production serves it: migrated and seeded SQLite file, uvicorn (ASGI) in a subprocess;
    with ``collect_static``, static files collected into its own STATIC_ROOT (served by WhiteNoise)."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL"}}
    env.setdefault("DJANGO_SETTINGS_MODULE", "agent_platform.settings")
    env.update(
        PLATFORM_VAR_DIR=str(workdir / "var"),
        SQLITE_PATH=str(workdir / "db.sqlite3"),
        DEMO_ADMIN_PASSWORD="e2e-admin-password",
        PYTHONUNBUFFERED="1",
        STATIC_ROOT=str(workdir / "static"),
        **extra_env,
    )

    api_key = seeded(env, extra=extra_env)  # migrated, seeded, a key issued: the session's copy
    if collect_static:
        manage_in(env, "collectstatic", "--noinput", "-v0")
    port = free_port()
    log = (workdir / "web.log").open("wb")
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "uvicorn", "agent_platform.asgi:application"),
            *("--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"),
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(f"{base_url}/healthz", timeout=2).status_code == 200, timeout=60, what="uvicorn")
        yield AsgiPlatform(base_url=base_url, api_key=api_key, env=env, workdir=workdir)
    finally:
        _stop(server)
        log.close()


class StreamReader(threading.Thread):
    """Reads one SSE response on its own thread, noting when the first bytes and each event arrived."""

    def __init__(self, client: httpx.Client, path: str, **headers: str) -> None:
        super().__init__(daemon=True)
        self.client, self.path, self.headers = client, path, headers
        self.opened = threading.Event()
        self.text = ""
        self.response: httpx.Response | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.client.stream("GET", self.path, headers=self.headers, timeout=httpx.Timeout(90)) as response:
                self.response = response
                for chunk in response.iter_text():
                    self.text += chunk
                    self.opened.set()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.opened.set()


@pytest.mark.e2e
def test_a_real_client_follows_a_run_executed_by_a_celery_worker(tmp_path: Path) -> None:
    # The cap (PLATFORM_SSE_MAX_S) ten minutes off: a stream that ends here ended with its run, never at the cap.
    with (
        asgi_platform(
            tmp_path, PLATFORM_SSE_KEEPALIVE_S="0.5", PLATFORM_SSE_POLL_S="0.1", PLATFORM_SSE_MAX_S="600"
        ) as platform,
        platform.client(timeout=30) as client,
    ):
        submitted = client.post(URL, json={"agent": "company-assistant", "query": "김하늘 님은 어느 팀 소속인가요?"})
        assert submitted.status_code == 202, submitted.text
        run_id = submitted.json()["id"]
        # The stream opens while the run is still queued (no worker yet): what follows is streamed live.
        reader = StreamReader(client, f"{URL}/{run_id}/events")
        reader.start()
        assert reader.opened.wait(30), "the stream never opened"
        assert reader.error is None, reader.error
        wait_until(lambda: "keep-alive" in reader.text, timeout=30, what="a quiet stream's keep-alive comment")
        assert "id:" not in reader.text
        with platform.worker():
            reader.join(timeout=90)
        assert not reader.is_alive(), f"the stream did not end:\n{reader.text}"
        assert reader.error is None, reader.error
        assert reader.response is not None
        assert reader.response.headers["content-type"].startswith("text/event-stream")
        assert reader.response.headers["cache-control"] == "no-cache"
        assert reader.response.headers["x-accel-buffering"] == "no"
        events, comments = parse_stream(reader.text)
        assert "keep-alive" in comments
        numbered = [e for e in events if e.id is not None]
        assert [int(e.id) for e in numbered] == list(range(1, len(numbered) + 1))
        assert numbered[0].event == "status"
        assert numbered[0].json["status"] == "running"
        kinds = [e.event for e in numbered]
        assert "rule" in kinds
        assert "deterministic_result" in kinds
        [result] = [e.json for e in numbered if e.event == "deterministic_result"]
        assert (result["tool"], result["ok"], result["value"]["team"]) == ("search_employee", True, "클라우드운영팀")
        assert numbered[-1].event == "status"
        assert numbered[-1].json["status"] == "succeeded"
        assert "클라우드운영팀" in numbered[-1].json["answer"]
        assert (events[-1].event, events[-1].json) == ("end", {"status": "succeeded"})

        # Reconnecting with Last-Event-ID replays the rest and ends with the run's end (the join bounds a hang).
        again = StreamReader(client, f"{URL}/{run_id}/events", **{"Last-Event-ID": str(numbered[-2].id)})
        again.start()
        again.join(timeout=60)
        assert not again.is_alive(), f"the replay did not end:\n{again.text}"
        assert again.error is None, again.error
        replayed, _ = parse_stream(again.text)
        assert [e.id for e in replayed] == [numbered[-1].id, None]
        assert (replayed[-1].event, replayed[-1].json) == ("end", {"status": "succeeded"})

        # Errors keep the API's shape on the ASGI server too.
        anonymous = httpx.get(f"{platform.base_url}{URL}/{run_id}/events", timeout=10)
        assert anonymous.status_code == 401
        assert anonymous.json()["error"]["code"] == "not_authenticated"
        missing = client.get(f"{URL}/00000000-0000-0000-0000-000000000000/events")
        assert (missing.status_code, missing.json()["error"]["code"]) == (404, "run_not_found")


def test_a_rule_decisions_reason_comes_with_its_text_in_the_callers_language(sse_client, finished_run) -> None:  # type: ignore[no-untyped-def]
    RunEvent.objects.filter(run=finished_run, kind="rule").update(
        data={"rule": "직원 소속 조회", "matched": False, "reason": "none of the keywords present"}
    )
    _response, text = stream_of(sse_client, f"{URL}/{finished_run.id}/events", HTTP_ACCEPT_LANGUAGE="ko")
    [rule] = [e for e in parse_stream(text)[0] if e.event == "rule"]
    assert rule.json["reason"] == "none of the keywords present"  # as stored: stable for programs
    assert rule.json["reason_text"] == "질의에 키워드가 하나도 없음"
