"""argparse's own words in a management command (``usage:``, ``options:``, ``error: the following arguments are
required: …``, the help of Django's common options) come from the platform's catalogue, like the rest of the
command's help and errors (agent_platform/argparse_text.py); and ``/readyz`` says truthfully that no worker runs
when the last one stopped cleanly."""

from __future__ import annotations

import argparse
import ast
import inspect
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, ManagementUtility, call_command
from django.test import override_settings
from django.utils import translation

from agent_platform import argparse_text
from agents.heartbeats import worker_heartbeat_forget, worker_heartbeat_record
from tests.postgres import manage

# The worker check's words where no worker wrote a heartbeat within PLATFORM_READY_WORKER_MAX_AGE_S (60 s).
NO_HEARTBEAT = (
    "no worker has written a heartbeat within 60 s (a worker cut off from its broker or database stops writing one)"
)

# Korean for a few of argparse's texts, in a catalogue of the test's own (the platform's catalogue is the lead's).
KOREAN = {
    "usage: ": "사용법: ",
    "positional arguments": "위치 인자",
    "options": "옵션",
    "show this help message and exit": "이 도움말을 보여 주고 끝냅니다",
    "%(prog)s: error: %(message)s\n": "%(prog)s: 오류: %(message)s\n",
    "argument %(argument_name)s: %(message)s": "%(argument_name)s 인자: %(message)s",
    "the following arguments are required: %s": "다음 인자가 필요합니다: %s",
    "invalid choice: %(value)r (choose from %(choices)s)": "잘못된 선택: %(value)r (%(choices)s 중 하나)",
    "Skip system checks.": "시스템 검사를 건너뜁니다.",
    "expected %s argument\x00expected %s arguments": "인자 %s개가 필요합니다",
}


def write_mo(path: Path, messages: dict[str, str]) -> None:
    """A GNU .mo catalogue of ``messages`` (a plural's msgid joins its forms with NUL), as msgfmt writes it."""
    entries = {
        "": "Content-Type: text/plain; charset=UTF-8\nPlural-Forms: nplurals=1; plural=0;\n",
        **messages,
    }
    keys = sorted(entries)
    ids = b"".join(key.encode() + b"\0" for key in keys)
    strs = b"".join(entries[key].encode() + b"\0" for key in keys)
    start = 7 * 4 + 16 * len(keys)
    offsets, id_offset, str_offset = [], 0, 0
    for key in keys:
        offsets.append(
            (len(key.encode()), start + id_offset, len(entries[key].encode()), start + len(ids) + str_offset)
        )
        id_offset += len(key.encode()) + 1
        str_offset += len(entries[key].encode()) + 1
    header = struct.pack("Iiiiiii", 0x950412DE, 0, len(keys), 7 * 4, 7 * 4 + 8 * len(keys), 0, 0)
    originals = b"".join(struct.pack("ii", length, offset) for length, offset, _l, _o in offsets)
    translations = b"".join(struct.pack("ii", length, offset) for _l, _o, length, offset in offsets)
    path.parent.mkdir(parents=True)
    path.write_bytes(header + originals + translations + ids + strs)


@pytest.fixture
def korean(tmp_path: Path):
    write_mo(tmp_path / "locale" / "ko" / "LC_MESSAGES" / "django.mo", KOREAN)
    with (
        override_settings(LANGUAGE_CODE="ko", LOCALE_PATHS=[tmp_path / "locale", *settings.LOCALE_PATHS]),
        translation.override("ko"),
    ):
        yield


def test_argparses_errors_come_from_the_platforms_catalogue(korean, capsys) -> None:
    with pytest.raises(CommandError) as refused:
        call_command("run_query")
    assert str(refused.value) == "Error: 다음 인자가 필요합니다: agent, query"

    with pytest.raises(SystemExit) as exited:
        ManagementUtility(["manage.py", "agent_version", "bogus", "x"]).execute()
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("사용법: manage.py agent_version")
    assert (
        "manage.py agent_version: 오류: action 인자: 잘못된 선택: 'bogus' "
        "('list', 'publish', 'rollback', 'diff', 'shadow' 중 하나)\n"
    ) in error

    with pytest.raises(SystemExit):
        ManagementUtility(["manage.py", "run_query", "a", "b", "--timeout", "-1"]).execute()
    assert "manage.py run_query: 오류: --timeout 인자: " in capsys.readouterr().err

    assert argparse.ngettext("expected %s argument", "expected %s arguments", 2) == "인자 %s개가 필요합니다"


def test_argparses_help_and_djangos_common_options_come_from_the_platforms_catalogue(korean, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        ManagementUtility(["manage.py", "run_query", "--help"]).execute()
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("사용법: manage.py run_query")
    assert "\n위치 인자:\n" in text and "\n옵션:\n" in text
    assert "이 도움말을 보여 주고 끝냅니다" in text and "시스템 검사를 건너뜁니다." in text
    assert "워커를 기다릴 시간(초)" in text  # the command's own help, from the platform's catalogue as before


def test_argparse_speaks_english_by_default(capsys) -> None:
    with pytest.raises(SystemExit):
        ManagementUtility(["manage.py", "run_query"]).execute()
    assert "manage.py run_query: error: the following arguments are required: agent, query\n" in capsys.readouterr().err


def texts_called(module: object, names: set[str]) -> set[str]:
    """The literal texts ``module`` passes to the functions ``names`` (a plural's two forms joined with NUL), as
    xgettext (``makemessages``) reads them."""
    texts = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):  # type: ignore[arg-type]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
            forms = [arg.value for arg in node.args[:2] if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
            plural = node.func.id in {"ngettext", "ngettext_lazy"}
            texts.add("\x00".join(forms) if plural else forms[0] if forms else "")
    return texts


def test_every_argparse_text_a_user_meets_is_in_the_catalogue() -> None:
    """The msgids are argparse's texts of this Python exactly; a Python whose argparse says something new fails
    here until argparse_text.py lists it."""
    said = texts_called(argparse, {"_", "ngettext"}) | {"subcommands"}  # _(kwargs.pop('title', 'subcommands'))
    for_programmers = {
        "",  # _(kwargs.pop(...)): a subparsers title or description the command gave, or the default above
        ".__call__() not defined",
        "conflicting subparser: %s",
        "conflicting subparser alias: %s",
        "cannot merge actions - two groups are named %r",
        "'required' is an invalid argument for positionals",
        "invalid option string %(option)r: must start with a character %(prefix_chars)r",
        "dest= is required for options like %r",
        "invalid conflict_resolution value: %r",
        "conflicting option string: %s\x00conflicting option strings: %s",
        "mutually exclusive arguments must be optional",
        "cannot have multiple subparser arguments",
        "%r is not callable",
    }
    listed = texts_called(argparse_text, {"gettext_noop", "ngettext_lazy"}) - argparse_text.DJANGO_OPTION_HELP
    assert said - for_programmers == listed
    assert len(listed) == len(argparse_text.MESSAGES) + len(argparse_text.PLURAL_MESSAGES)


@pytest.mark.django_db
def test_readyz_says_no_worker_runs_after_the_last_one_stopped_cleanly(client) -> None:
    worker_heartbeat_record(worker="w1@host:1")
    worker_heartbeat_forget(worker="w1@host:1")  # what a worker does as it stops cleanly
    response = client.get("/readyz")
    assert response.status_code == 503
    worker = response.json()["checks"]["worker"]
    assert worker == {"ok": False, "error": NO_HEARTBEAT, "ms": worker["ms"]}


# The platform's own catalogue (locale/ko), which the lead fills: these are the texts a user meets most.
KEY_MESSAGES = (
    "usage: ",
    "%(prog)s: error: %(message)s\n",
    "argument %(argument_name)s: %(message)s",
    "the following arguments are required: %s",
    "invalid choice: %(value)r (choose from %(choices)s)",
)


@pytest.mark.slow
def test_a_real_manage_py_prints_argparses_errors_in_korean(tmp_path: Path) -> None:
    with override_settings(LANGUAGE_CODE="ko"), translation.override("ko"):
        korean = {msgid: translation.gettext(msgid) for msgid in KEY_MESSAGES}
    assert all(korean[msgid] != msgid for msgid in KEY_MESSAGES), "locale/ko lacks a Korean entry for argparse"

    done = manage("agent_version", "bogus", "x", sqlite_path=str(tmp_path / "db.sqlite3"), env={"LANGUAGE_CODE": "ko"})
    assert done.returncode == 2
    invalid = korean["invalid choice: %(value)r (choose from %(choices)s)"] % {
        "value": "bogus",
        "choices": "'list', 'publish', 'rollback', 'diff', 'shadow'",
    }
    argument = korean["argument %(argument_name)s: %(message)s"] % {"argument_name": "action", "message": invalid}
    assert done.stderr.startswith(korean["usage: "] + "manage.py agent_version")
    assert done.stderr.endswith(
        korean["%(prog)s: error: %(message)s\n"] % {"prog": "manage.py agent_version", "message": argument}
    )

    done = manage("run_query", sqlite_path=str(tmp_path / "db.sqlite3"), env={"LANGUAGE_CODE": "ko"})
    required = korean["the following arguments are required: %s"] % "agent, query"
    assert done.returncode == 2
    assert done.stderr.endswith(
        korean["%(prog)s: error: %(message)s\n"] % {"prog": "manage.py run_query", "message": required}
    )


@pytest.mark.slow
def test_the_asgi_application_loads_before_any_settings_are_named(tmp_path: Path) -> None:
    """uvicorn (./bin/up) imports ``agent_platform.asgi`` with no DJANGO_SETTINGS_MODULE: its package is imported
    first, and argparse's texts marked there with Django's ``gettext_noop`` read the settings, unnamed yet (the
    quick start's web server did not start)."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PLATFORM_VAR_DIR"] = str(tmp_path / "var")
    done = subprocess.run(
        [sys.executable, "-c", "import agent_platform.asgi as a; print(callable(a.application))"],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "True"), done.stderr[-2000:]
