"""The settings' number variables (``agent_platform/settings.py``, ``settings_api.py``): unset or blank is the
default; a value that is no number, or below the lowest the setting can mean, stops the settings from loading with
an ``ImproperlyConfigured`` naming the variable and the value (a bare ``int()`` said "invalid literal", a blank
value was refused, and a negative one was taken: ``PLATFORM_READY_WORKER_MAX_AGE_S=-5`` made ``/readyz`` never
ready, ``PLATFORM_RUN_QUERY_MAX_CHARS=-5`` every run a 413).

Every value is tried in one fresh process that loads the settings modules again for each (they read the
environment as they load)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest

from tests.e2e.harness import _SETUP_VARIABLES, ROOT

# (variable, the lowest value it takes, the highest it refuses): 0 where 0 means "off", "never" or "at once",
# above 0 where a zero would be a limit nothing fits in or a poll that never pauses, 1 for counts and sizes.
WHOLE_NUMBERS = [
    ("DB_CONN_MAX_AGE", "0", "-1"),
    ("DB_PREPARE_THRESHOLD", "0", "-1"),
    ("PLATFORM_FLOW_MAX_CALLS", "1", "0"),
    ("PLATFORM_RUN_QUERY_MAX_CHARS", "1", "-5"),
    ("PLATFORM_AUDIT_RESULT_MAX_CHARS", "0", "-1"),
    ("PLATFORM_TOOL_RESULT_MAX_CHARS", "1", "0"),
    ("PLATFORM_PARALLEL_TOOL_CALLS", "1", "0"),
    ("PLATFORM_PARALLEL_TOOL_CALLS_PER_SERVER", "1", "0"),
    ("AUDIT_ANCHOR_S3_RETENTION_DAYS", "1", "0"),
    ("PLATFORM_SESSION_AGE_S", "1", "0"),
    ("PLATFORM_MAX_BODY_BYTES", "1", "0"),
    ("PLATFORM_LOGIN_MAX_FAILURES", "1", "0"),
    ("PLATFORM_LOGIN_IP_MAX_FAILURES", "1", "0"),
    ("PLATFORM_LOGIN_WINDOW_S", "1", "0"),
    ("PLATFORM_LOGIN_LOCKOUT_S", "1", "0"),
    ("PLATFORM_PROXY_HOPS", "0", "-1"),
    ("PLATFORM_EVAL_WINDOW", "1", "0"),
    ("PLATFORM_APPROVAL_TTL_S", "1", "0"),
    ("PLATFORM_API_MAX_BODY_BYTES", "1", "0"),
    ("PLATFORM_API_MAX_JSON_DEPTH", "1", "0"),
    ("PLATFORM_SSE_MAX_STREAMS_PER_KEY", "1", "0"),
]
SECONDS = [
    ("PLATFORM_BROKER_POLL_S", "0.001", "0"),
    ("PLATFORM_RUN_WAIT_MIN_POLL_S", "0.001", "0"),
    ("PLATFORM_RUN_EVENT_WAKEUP_GATHER_S", "0", "-0.5"),
    ("PLATFORM_TOOL_TIMEOUT_MAX_S", "0.5", "0"),
    ("PLATFORM_MCP_IDLE_CLOSE_S", "0", "-1"),
    ("PLATFORM_EMBEDDINGS_TIMEOUT_S", "0.5", "0"),
    ("AUDIT_ANCHOR_INTERVAL_S", "0", "-1"),
    ("AUDIT_CHAIN_INTERVAL_S", "0", "-1"),
    ("AUDIT_CHAIN_GATHER_S", "0", "-0.01"),
    ("AUDIT_CHAIN_HOLD_OFF_S", "0", "-1"),
    ("PLATFORM_WORKER_HEARTBEAT_S", "0", "-1"),
    ("PLATFORM_EVAL_REFRESH_S", "0", "-1"),
    ("PLATFORM_EVAL_CASE_TIMEOUT_S", "0", "-1"),
    ("PLATFORM_READY_WORKER_MAX_AGE_S", "0.5", "-5"),
    ("PLATFORM_API_MAX_WAIT_S", "0", "-1"),
    ("PLATFORM_SSE_POLL_S", "0.01", "0"),
    ("PLATFORM_SSE_KEEPALIVE_S", "0.5", "0"),
    ("PLATFORM_SSE_MAX_S", "1", "0"),
    ("PLATFORM_SSE_AUTH_RECHECK_S", "0.5", "0"),
]
NOT_NUMBERS = {name: ("five", "1.5") for name, _lowest, _refused in WHOLE_NUMBERS} | {
    name: ("five", "nan", "inf") for name, _lowest, _refused in SECONDS
}

# Loads the settings modules again with each variable set in turn; prints, per variable and value, the settings'
# JSON-able values (or the error that stopped them loading, its class named).
LOAD_EACH = """
import importlib, json, os, sys

MODULES = ("agent_platform.settings", "agent_platform.settings_api", "agent_platform.settings_deploy")


def load(env):
    for name in MODULES:
        sys.modules.pop(name, None)
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        module = importlib.import_module("agent_platform.settings")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        os.environ.clear()
        os.environ.update(saved)
    values = {}
    for name in (n for n in dir(module) if n.isupper()):
        try:
            values[name] = json.loads(json.dumps(getattr(module, name)))
        except (TypeError, ValueError):
            pass  # a path, a lazy translation: not a number variable's
    return values


tried = json.loads(sys.argv[1])
print(json.dumps({"unset": load({}), **{name: {v: load({name: v}) for v in values} for name, values in tried.items()}}))
"""


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tried = {
        name: ["", " ", lowest, refused, *NOT_NUMBERS[name]] for name, lowest, refused in [*WHOLE_NUMBERS, *SECONDS]
    }
    base = {k: v for k, v in os.environ.items() if not k.startswith(_SETUP_VARIABLES)}
    env = {
        **base,
        "PLATFORM_VAR_DIR": str(tmp_path_factory.mktemp("numbers") / "var"),
        # PostgreSQL's options are read only for PostgreSQL (never connected to here).
        "DATABASE_URL": "postgres://platform@db.invalid:5432/platform",
    }
    done = subprocess.run(
        [sys.executable, "-c", LOAD_EACH, json.dumps(tried)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _refusal(loaded: dict[str, Any], name: str, value: str) -> str:
    outcome = loaded[name][value]
    assert isinstance(outcome, str), f"{name}={value!r} was taken"
    return outcome


@pytest.mark.slow  # the fixture loads the settings about 250 times in a fresh process: 4-5 s here
@pytest.mark.parametrize(("name", "lowest", "refused"), [*WHOLE_NUMBERS, *SECONDS])
def test_a_number_variable_left_blank_is_its_default(
    loaded: dict[str, Any], name: str, lowest: str, refused: str
) -> None:
    assert loaded[name][""] == loaded["unset"]
    assert loaded[name][" "] == loaded["unset"]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "lowest", "refused"), [*WHOLE_NUMBERS, *SECONDS])
def test_a_number_variable_takes_its_lowest_sensible_value(
    loaded: dict[str, Any], name: str, lowest: str, refused: str
) -> None:
    assert isinstance(loaded[name][lowest], dict), loaded[name][lowest]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "lowest", "refused"), [*WHOLE_NUMBERS, *SECONDS])
def test_a_number_variable_below_its_bound_stops_the_settings_naming_it(
    loaded: dict[str, Any], name: str, lowest: str, refused: str
) -> None:
    refusal = _refusal(loaded, name, refused)

    assert refusal.startswith(f"ImproperlyConfigured: {name} must be a ")
    assert refusal.endswith(f", not {refused!r}")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NOT_NUMBERS))
def test_a_number_variable_that_is_no_number_stops_the_settings_naming_it(loaded: dict[str, Any], name: str) -> None:
    for value in NOT_NUMBERS[name]:
        refusal = _refusal(loaded, name, value)

        assert refusal.startswith(f"ImproperlyConfigured: {name} must be a "), refusal
        assert refusal.endswith(f", not {value!r}"), refusal


@pytest.mark.slow
def test_the_defaults_are_the_documented_ones(loaded: dict[str, Any]) -> None:
    unset = loaded["unset"]

    assert unset["PLATFORM_READY_WORKER_MAX_AGE_S"] == 60.0 and unset["PLATFORM_WORKER_HEARTBEAT_S"] == 10.0
    assert unset["PLATFORM_RUN_QUERY_MAX_CHARS"] == 8000 and unset["PLATFORM_PROXY_HOPS"] == 0
    assert unset["SESSION_COOKIE_AGE"] == 8 * 3600 and unset["PLATFORM_APPROVAL_TTL_S"] == 3600
    assert unset["PLATFORM_SSE_AUTH_RECHECK_S"] == 10.0 and unset["PLATFORM_API_MAX_BODY_BYTES"] == 2 * 1024 * 1024
    assert unset["DATABASES"]["default"]["CONN_MAX_AGE"] == 0
    assert unset["DATABASES"]["default"]["OPTIONS"]["prepare_threshold"] == 5
    assert unset["CELERY_BROKER_TRANSPORT_OPTIONS"]["polling_interval"] == 0.01


def test_every_number_variable_the_settings_read_is_bounded_and_tried_here() -> None:
    read: set[str] = set()
    for module in ("settings.py", "settings_api.py"):
        source = (ROOT / "agent_platform" / module).read_text(encoding="utf-8")
        assert not re.search(r"\b(int|float)\(os\.environ", source), f"{module} reads a number without its bound"
        calls = re.findall(r"_env_(?:int|float)\(\s*\"(\w+)\",[^)]*\)", source)
        bounds = re.findall(r"_env_(?:int|float)\([^)]*\)", source)
        assert all("at_least=" in call or "above=" in call for call in bounds), bounds
        read.update(calls)

    assert read == {name for name, _lowest, _refused in [*WHOLE_NUMBERS, *SECONDS]}
