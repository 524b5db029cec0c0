"""The settings' number variables (``agent_platform/settings.py``, ``settings_api.py``): unset or blank is the
default; a value that is no number, or below the lowest the setting can mean, stops the settings from loading with
an ``ImproperlyConfigured`` naming the variable and the value (a bare ``int()`` said "invalid literal", a blank
value was refused, and a negative one was taken: ``PLATFORM_READY_WORKER_MAX_AGE_S=-5`` made ``/readyz`` never
ready, ``PLATFORM_RUN_QUERY_MAX_CHARS=-5`` every run a 413). A bound refuses only what never worked: a variable
whose negative values meant what its 0 means (off, at once, one by one) has none, so an upgrade still starts.

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
# above 0 where a zero would be a limit nothing fits in or a poll that never pauses, 1 for counts and sizes; None
# refused (and a negative value taken) where a negative value always meant what 0 means.
WHOLE_NUMBERS: list[tuple[str, str, str | None]] = [
    ("DB_CONN_MAX_AGE", "-1", None),
    ("DB_PREPARE_THRESHOLD", "-1", None),
    ("PLATFORM_FLOW_MAX_CALLS", "1", "0"),
    ("PLATFORM_MAX_TOOL_CALLS_PER_TURN", "1", "0"),
    ("PLATFORM_RUN_QUERY_MAX_CHARS", "1", "-5"),
    ("PLATFORM_AUDIT_RESULT_MAX_CHARS", "0", "-1"),
    ("PLATFORM_TOOL_RESULT_MAX_CHARS", "1", "0"),
    ("PLATFORM_PARALLEL_TOOL_CALLS", "-1", None),
    ("PLATFORM_PARALLEL_TOOL_CALLS_PER_SERVER", "1", "0"),
    ("AUDIT_ANCHOR_S3_RETENTION_DAYS", "1", "0"),
    ("PLATFORM_SESSION_AGE_S", "1", "0"),
    ("PLATFORM_MAX_BODY_BYTES", "1", "0"),
    ("PLATFORM_LOGIN_MAX_FAILURES", "1", "0"),
    ("PLATFORM_LOGIN_IP_MAX_FAILURES", "1", "0"),
    ("PLATFORM_LOGIN_WINDOW_S", "1", "0"),
    ("PLATFORM_LOGIN_LOCKOUT_S", "0", "-1"),
    ("PLATFORM_PROXY_HOPS", "-1", None),
    ("PLATFORM_EVAL_WINDOW", "-1", None),
    ("PLATFORM_APPROVAL_TTL_S", "1", "0"),
    ("PLATFORM_API_MAX_BODY_BYTES", "1", "0"),
    ("PLATFORM_API_MAX_JSON_DEPTH", "1", "0"),
    ("PLATFORM_API_MAX_JSON_ITEMS", "1", "0"),
    ("PLATFORM_SSE_MAX_STREAMS_PER_KEY", "1", "0"),
]
SECONDS: list[tuple[str, str, str | None]] = [
    ("PLATFORM_BROKER_POLL_S", "0.001", "0"),
    ("PLATFORM_RUN_WAIT_MIN_POLL_S", "-1", None),
    ("PLATFORM_RUN_EVENT_WAKEUP_GATHER_S", "-0.5", None),
    ("PLATFORM_TOOL_TIMEOUT_MAX_S", "0.5", "0"),
    ("PLATFORM_MCP_IDLE_CLOSE_S", "-1", None),
    ("PLATFORM_EMBEDDINGS_TIMEOUT_S", "0.5", "0"),
    ("REDIS_CACHE_TIMEOUT_S", "0.05", "0"),
    ("AUDIT_ANCHOR_INTERVAL_S", "-1", None),
    ("AUDIT_CHAIN_INTERVAL_S", "-1", None),
    ("AUDIT_CHAIN_GATHER_S", "0", "-0.01"),
    ("AUDIT_CHAIN_HOLD_OFF_S", "-1", None),
    ("PLATFORM_WORKER_HEARTBEAT_S", "-1", None),
    ("PLATFORM_EVAL_REFRESH_S", "-1", None),
    ("PLATFORM_EVAL_CASE_TIMEOUT_S", "-1", None),
    ("PLATFORM_READY_WORKER_MAX_AGE_S", "0.5", "-5"),
    ("PLATFORM_API_MAX_WAIT_S", "0", "-1"),
    ("PLATFORM_SSE_POLL_S", "0.01", "0"),
    ("PLATFORM_SSE_KEEPALIVE_S", "-1", None),
    ("PLATFORM_SSE_MAX_S", "1", "0"),
    ("PLATFORM_SSE_AUTH_RECHECK_S", "0.5", "0"),
]
NOT_NUMBERS = {name: ("five", "1.5") for name, _lowest, _refused in WHOLE_NUMBERS} | {
    name: ("five", "nan", "inf") for name, _lowest, _refused in SECONDS
}
BOUNDED = [(name, lowest, refused) for name, lowest, refused in [*WHOLE_NUMBERS, *SECONDS] if refused is not None]
# Settings loaded together (a bound that depends on another variable).
TOGETHER = {
    # One call at a time: the per-server number is never used, so its 0 still starts (it did before).
    "one by one": {"PLATFORM_PARALLEL_TOOL_CALLS": "1", "PLATFORM_PARALLEL_TOOL_CALLS_PER_SERVER": "0"},
    "off, as 0": {"PLATFORM_PARALLEL_TOOL_CALLS": "0", "PLATFORM_PARALLEL_TOOL_CALLS_PER_SERVER": "-3"},
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


tried, together = json.loads(sys.argv[1])
print(json.dumps({
    "unset": load({}),
    "together": {label: load(env) for label, env in together.items()},
    **{name: {v: load({name: v}) for v in values} for name, values in tried.items()},
}))
"""


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tried = {
        name: ["", " ", lowest, *([refused] if refused is not None else []), *NOT_NUMBERS[name]]
        for name, lowest, refused in [*WHOLE_NUMBERS, *SECONDS]
    }
    base = {k: v for k, v in os.environ.items() if not k.startswith(_SETUP_VARIABLES)}
    env = {
        **base,
        "PLATFORM_VAR_DIR": str(tmp_path_factory.mktemp("numbers") / "var"),
        # PostgreSQL's options are read only for PostgreSQL (never connected to here).
        "DATABASE_URL": "postgres://platform@db.invalid:5432/platform",
    }
    done = subprocess.run(
        [sys.executable, "-c", LOAD_EACH, json.dumps([tried, TOGETHER])],
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
@pytest.mark.parametrize(("name", "lowest", "refused"), BOUNDED)
def test_a_number_variable_below_its_bound_stops_the_settings_naming_it(
    loaded: dict[str, Any], name: str, lowest: str, refused: str
) -> None:
    assert refused is not None
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
    unbounded: set[str] = set()
    for module in ("settings.py", "settings_api.py"):
        source = (ROOT / "agent_platform" / module).read_text(encoding="utf-8")
        assert not re.search(r"\b(int|float)\(os\.environ", source), f"{module} reads a number without its bound"
        calls = re.findall(r"_env_(?:int|float)\(\s*\"(\w+)\",[^)]*\)", source)
        bounds = re.findall(r"_env_(?:int|float)\(\s*\"(\w+)\",([^)]*)\)", source)
        unbounded.update(name for name, rest in bounds if "at_least=" not in rest and "above=" not in rest)
        read.update(calls)

    assert read == {name for name, _lowest, _refused in [*WHOLE_NUMBERS, *SECONDS]}
    # Only where a negative value always worked (as 0 does): every other one is bounded.
    assert unbounded == {name for name, _lowest, refused in [*WHOLE_NUMBERS, *SECONDS] if refused is None}


@pytest.mark.slow
def test_a_negative_prepare_threshold_still_means_never_prepared(loaded: dict[str, Any]) -> None:
    options = loaded["DB_PREPARE_THRESHOLD"]["-1"]["DATABASES"]["default"]["OPTIONS"]

    assert options["prepare_threshold"] is None


@pytest.mark.slow
@pytest.mark.parametrize("label", sorted(TOGETHER))
def test_no_parallel_calls_takes_any_per_server_number(loaded: dict[str, Any], label: str) -> None:
    """A per-server 0 is refused only where calls run at once (BOUNDED: with the default 4 per run)."""
    assert isinstance(loaded["together"][label], dict), loaded["together"][label]


def test_a_per_run_number_below_two_sends_calls_one_by_one() -> None:
    from agents.parallel_calls import ParallelCalls

    for per_run in (1, 0, -1):
        calls = ParallelCalls(
            index={"lookup": (object(), object())},  # type: ignore[dict-item]
            offer=None,  # type: ignore[arg-type]
            who=None,  # type: ignore[arg-type]
            per_run=per_run,
            per_server=0,
            trace=[],
            emit=lambda *_args: None,
        )

        assert not calls.eligible({"name": "lookup", "args": {}})


def test_an_eval_window_below_one_keeps_one_case_in_flight(settings: Any) -> None:
    from evals.services import eval_window

    for window in (0, -3):
        settings.PLATFORM_EVAL_WINDOW = window

        assert eval_window() == 1
