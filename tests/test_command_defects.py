"""Management commands that answered a mistake with a traceback, stored what Django would refuse, or spoke English
and UTC under a Korean platform:

1. ``create_auditor`` and ``seed_demo --admin-username`` stored a user Django would refuse (an empty name, one
   with spaces or over 150 characters, an e-mail that is none): ``user_create`` saves without the validators.
2. ``run_query`` exited 0 for a cancelled run and for one left waiting for an approval, and printed the raw
   status and the stored (English) rule reason.
3. ``agent_version shadow AGENT abc`` raised ValueError; ``agent_version list`` printed UTC with no zone.
4. ``create_api_key ""`` (or a name too long) raised ValidationError.
5. ``verify_audit --checkpoint-file`` in a folder that does not exist raised FileNotFoundError after verifying.
6. ``import_config`` printed pydantic's English and never named the valid keys of an unknown one.
7. ``revoke_api_key`` printed a revocation time in UTC.
8. An empty or unknown ``LANGUAGE_CODE`` stopped every command in ``django.setup``.
9. ``rotate_secrets`` with a ``SECRETS_ENCRYPTION_KEYS`` that is no Fernet key ended in a traceback.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import unicodedata
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.utils import timezone, translation

from agents.models import Agent, AgentVersion, ApiKey, Approval, Run
from agents.services import agent_version_publish, api_key_create, api_key_revoke, run_cancel
from mcpregistry.models import McpServer
from tests.audit.test_chain import record, verify
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db


# ---- 1. users Django would refuse ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        (["bad name!"], "username"),
        (["a" * 151], "username"),
        (["auditor2", "--email", "not-an-email"], "email address"),
    ],
)
def test_create_auditor_refuses_a_user_django_would_refuse(arguments: list[str], field: str) -> None:
    with pytest.raises(CommandError) as refused:
        call_command("create_auditor", *arguments, stdout=io.StringIO(), stderr=io.StringIO())
    assert str(refused.value).startswith(f"{field}: ")
    assert not get_user_model().objects.exists()


def test_create_auditor_names_the_problem_in_the_platforms_language() -> None:
    with translation.override("ko"), pytest.raises(CommandError) as refused:
        call_command("create_auditor", "auditor2", "--email", "x@", stdout=io.StringIO(), stderr=io.StringIO())
    assert str(refused.value) == "이메일 주소: 유효한 이메일 주소를 입력하세요."


def test_create_auditor_keeps_a_korean_name_composed() -> None:
    decomposed = unicodedata.normalize("NFD", "김하늘")
    call_command("create_auditor", decomposed, stdout=io.StringIO(), stderr=io.StringIO())
    assert get_user_model().objects.get().get_username() == "김하늘"  # as the login form composes what is typed


@pytest.mark.parametrize("username", ["", "demo admin", "x" * 151])
def test_seed_demo_refuses_an_admin_name_django_would_refuse_and_keeps_nothing(username: str) -> None:
    with pytest.raises(CommandError, match=r"^username: "):
        call_command("seed_demo", "--admin-username", username, "--no-discover", stdout=io.StringIO())
    assert not get_user_model().objects.exists()
    assert not McpServer.objects.exists()  # the demo was not left half seeded


# ---- 2. run_query's outcomes ---------------------------------------------------------------------------------


def query(monkeypatch: pytest.MonkeyPatch, outcome: Any) -> tuple[str, str]:
    """``run_query --inline`` on an agent whose execution is ``outcome(run)``; its stdout and stderr."""

    def execute(*, run_id: str) -> None:
        outcome(Run.objects.get(pk=run_id))

    monkeypatch.setattr("agents.management.commands.run_query.run_execute", execute)
    make_agent(slug="cli-outcomes", servers=[], with_demo_rules=False)
    out, err = io.StringIO(), io.StringIO()
    call_command("run_query", "cli-outcomes", "김하늘 님은 어느 팀인가요?", "--inline", stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.mark.slow
def test_run_query_exits_non_zero_for_a_cancelled_run(monkeypatch: pytest.MonkeyPatch) -> None:
    with translation.override("ko"), pytest.raises(CommandError) as refused:
        query(monkeypatch, lambda run: run_cancel(run=run, actor="운영자"))
    run = Run.objects.get()
    assert refused.value.returncode == 1
    assert str(refused.value) == f"실행 {run.id}이(가) 취소되었습니다: 운영자이(가) 취소함"


@pytest.mark.slow
def test_run_query_exits_with_its_own_status_for_a_run_awaiting_approval(monkeypatch: pytest.MonkeyPatch) -> None:
    def park(run: Run) -> None:
        Approval.objects.create(
            run=run, mcp_id="crm", tool="delete_customer", expires_at=timezone.now() + timedelta(hours=1)
        )
        Run.objects.filter(pk=run.pk).update(status=Run.Status.AWAITING_APPROVAL)

    with pytest.raises(CommandError) as refused:
        query(monkeypatch, park)
    approval = Approval.objects.get()
    message = str(refused.value)
    assert refused.value.returncode == 3
    assert f"crm.delete_customer ({approval.id})" in message
    assert "/admin/agents/approval/" in message
    # Not the REST route: a run of no API key is no key's to see or decide (that POST answered 404 to every key).
    assert "/api/v1/" not in message


@pytest.mark.slow
def test_run_query_inline_is_executed_here_and_never_sent_to_a_worker(
    monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    """``--inline`` dispatched the run too: a running worker took it first and ran it under its own code and
    settings ("held by …; nothing to do" here), and with none running its message waited on the broker."""
    sent: list[str] = []
    monkeypatch.setattr("agents.services.run_dispatch", lambda *, run_id, **_kw: sent.append(run_id))

    def answer(run: Run) -> None:
        Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED, answer="답")

    with django_capture_on_commit_callbacks(execute=True) as callbacks:  # as a commit runs them
        query(monkeypatch, answer)
    assert sent == [] and callbacks is not None


def test_run_query_prints_the_status_and_a_rules_reason_in_the_platforms_language(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def answer(run: Run) -> None:
        trace = [{"type": "rule", "rule": "직원 소속 조회", "matched": False, "reason": "regex did not match"}]
        Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED, answer="답", messages=trace)

    with translation.override("ko"):
        out, err = query(monkeypatch, answer)
    assert "  성공" in err.splitlines() and "succeeded" not in err
    assert "(정규식이 일치하지 않음)" in out and "regex did not match" not in out


# ---- 3. agent_version ----------------------------------------------------------------------------------------


def test_agent_version_shadow_refuses_a_version_that_is_no_number() -> None:
    make_agent(slug="versioned", servers=[], with_demo_rules=False)
    with pytest.raises(CommandError, match="the version must be a version number or 'off', not 'abc'"):
        call_command("agent_version", "shadow", "versioned", "abc", stdout=io.StringIO())


def test_agent_version_list_prints_local_time_with_its_zone() -> None:
    agent = make_agent(slug="versioned", servers=[], with_demo_rules=False)
    agent_version_publish(agent=agent, actor="test", via="tests")
    created = timezone.localtime(AgentVersion.objects.get().created_at)
    out = io.StringIO()
    call_command("agent_version", "list", "versioned", stdout=out)
    assert out.getvalue().split("\t")[1] == f"{created:%Y-%m-%d %H:%M:%S} KST"


def test_agent_version_list_says_so_when_the_agent_has_no_version() -> None:
    make_agent(slug="versioned", servers=[], with_demo_rules=False)
    out, err = io.StringIO(), io.StringIO()
    call_command("agent_version", "list", "versioned", stdout=out, stderr=err)
    assert out.getvalue() == ""  # one line per version for scripts: none
    assert err.getvalue().strip() == "versioned has no published version yet."


# ---- 4. and 7. API keys --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "k" * 300])
def test_create_api_key_refuses_a_name_the_model_refuses(name: str) -> None:
    with pytest.raises(CommandError):
        call_command("create_api_key", name, stdout=io.StringIO())
    assert not ApiKey.objects.exists()


def test_revoke_api_key_prints_when_a_key_was_revoked_in_local_time() -> None:
    key, _raw = api_key_create(name="old-key", actor="test", via="tests")
    api_key_revoke(api_key=key, actor="test", via="tests")
    key.refresh_from_db()
    assert key.revoked_at is not None
    out = io.StringIO()
    call_command("revoke_api_key", "old-key", stdout=out)
    assert f"{timezone.localtime(key.revoked_at):%Y-%m-%d %H:%M:%S} KST" in out.getvalue()
    assert "UTC" not in out.getvalue()


# ---- 5. verify_audit's checkpoint file -----------------------------------------------------------------------


def test_verify_audit_says_the_checkpoint_file_cannot_be_written(tmp_path: Path) -> None:
    record(2)
    checkpoint = tmp_path / "no-such-folder" / "audit-head.json"
    assert verify("--checkpoint-file", str(checkpoint)) == (
        f"FAILED: verified 2 events, but the checkpoint file {checkpoint} cannot be written: no such file or folder"
    )


# ---- 6. import_config ----------------------------------------------------------------------------------------


def import_config(tmp_path: Path, document: dict[str, Any]) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(CommandError) as refused:
        call_command("import_config", str(path), stdout=io.StringIO())
    return str(refused.value)


def test_import_config_names_the_valid_keys_of_an_unknown_one(tmp_path: Path) -> None:
    message = import_config(tmp_path, {"server": [], "agents": [{"slug": "a", "max_iteration": 3}]})
    unknown_section = next(line for line in message.splitlines() if line.startswith("server:"))
    assert unknown_section.startswith("server: 'server' is not a valid key (did you mean 'servers'?); the valid keys")
    assert unknown_section.endswith(", eval_sets")  # a section another app adds is a valid key too
    assert "agents[0] (a).max_iteration: 'max_iteration' is not a valid key (did you mean 'max_iterations'?)" in (
        message
    )


def test_import_config_speaks_the_platforms_language(tmp_path: Path) -> None:
    with translation.override("ko"):
        message = import_config(tmp_path, {"agents": [{"slug": "a", "max_iterations": "many"}]})
    assert message == "설정이 올바르지 않습니다:\nagents[0] (a).max_iterations: 정수여야 합니다"


def test_import_config_tells_a_text_too_long_or_off_its_pattern_in_the_platforms_language(tmp_path: Path) -> None:
    document = {
        "tools": [{"mcp_id": "x", "tool": "t" * 300}],
        "agents": [{"slug": "a", "arms": [{"name": "a b", "version": 1}]}],
    }
    with translation.override("en"):
        message = import_config(tmp_path, document)
    assert "tool: must be at most" in message and "characters" in message
    # An arm's name in words, as the admin refuses it, not the regular expression it was checked by.
    assert "name: Use ASCII letters (a–z, A–Z), digits, _ and - only (e.g. team-a_v2)" in message
    with translation.override("ko"):
        message = import_config(tmp_path, document)
    assert "String should" not in message and "should match" not in message
    assert "name: ASCII 영문자(a–z, A–Z), 숫자, _, -만 쓰세요" in message


# ---- 8. LANGUAGE_CODE ----------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("language", ["", "xx"])
def test_an_empty_or_unknown_language_code_is_english(language: str, tmp_path: Path) -> None:
    environment = {**os.environ, "LANGUAGE_CODE": language, "PLATFORM_VAR_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=settings.BASE_DIR,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "System check identified no issues" in done.stdout


# ---- 9. rotate_secrets ---------------------------------------------------------------------------------------


def test_rotate_secrets_refuses_a_key_that_is_no_fernet_key(settings: Any) -> None:
    settings.SECRETS_ENCRYPTION_KEYS = Fernet.generate_key().decode()
    secrets = {"api_key": "sk-live-abcdefgh1234"}
    Agent.objects.create(slug="keyed", name="keyed", model_secrets=secrets)  # type: ignore[misc]  # typed as text
    settings.SECRETS_ENCRYPTION_KEYS = "garbage"
    with pytest.raises(CommandError, match=r"^SECRETS_ENCRYPTION_KEYS holds a value that is not a Fernet key \("):
        call_command("rotate_secrets", stdout=io.StringIO())
    # In the reader's language, with how to make a key.
    with translation.override("ko"), pytest.raises(CommandError) as refused:
        call_command("rotate_secrets", stdout=io.StringIO())
    assert "Fernet" in str(refused.value) and "generate_key" in str(refused.value)
    assert re.search("[가-힣]", str(refused.value))
