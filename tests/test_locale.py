"""Korean throughout: every message of ours has a Korean translation in the shipped catalogue, none fuzzy, and
the compiled catalogue says the same. The first test extracts the messages from the code as they are now
(``makemessages`` in a copy of the project), so a new string without a Korean msgstr fails here."""

from __future__ import annotations

import gettext
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.utils import translation

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = ROOT / "locale" / "ko" / "LC_MESSAGES" / "django.po"
SOURCES = ("agent_platform", "agents", "audit", "auditor", "evals", "mcpregistry", "locale", "manage.py")


@dataclass
class Entry:
    msgid: str = ""
    msgid_plural: str = ""
    msgctxt: str | None = None
    msgstr: dict[int, str] = field(default_factory=dict)
    flags: set[str] = field(default_factory=set)
    obsolete: bool = False

    @property
    def translated(self) -> bool:
        return bool(self.msgstr) and all(self.msgstr.values())


def _unquote(text: str) -> str:
    body = text.strip()[1:-1]
    return re.sub(r'\\(["\\nt])', lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), body)


def po_entries(path: Path) -> list[Entry]:
    """The entries of a .po file (enough of the format for gettext's own output: flags, contexts, plurals,
    continued strings, obsolete ``#~`` entries)."""
    entries: list[Entry] = []
    current = Entry()
    target: tuple[str, int] | None = None
    started = False

    def finish() -> None:
        nonlocal current, started, target
        if started:
            entries.append(current)
        current, started, target = Entry(), False, None

    for raw in [*path.read_text(encoding="utf-8").splitlines(), ""]:
        line = raw
        if line.startswith("#~"):
            current.obsolete = True
            line = line[2:].strip()
            if not line:
                continue
        if not line.strip():
            finish()
            continue
        if line.startswith("#,"):
            if started and target and target[0] == "msgstr":
                finish()
            current.flags |= {flag.strip() for flag in line[2:].split(",")}
            continue
        if line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        if line.startswith('"') and target is not None:
            name, index = target
            value = _unquote(line)
            if name == "msgstr":
                current.msgstr[index] += value
            elif name == "msgctxt":
                current.msgctxt = (current.msgctxt or "") + value
            else:
                setattr(current, name, getattr(current, name) + value)
            continue
        if keyword in ("msgctxt", "msgid") and started and target and target[0] == "msgstr":
            finish()
        started = True
        if keyword == "msgctxt":
            current.msgctxt, target = _unquote(rest), ("msgctxt", 0)
        elif keyword == "msgid":
            current.msgid, target = _unquote(rest), ("msgid", 0)
        elif keyword == "msgid_plural":
            current.msgid_plural, target = _unquote(rest), ("msgid_plural", 0)
        elif keyword.startswith("msgstr"):
            index = int(keyword[7:-1]) if keyword.startswith("msgstr[") else 0
            current.msgstr[index] = _unquote(rest)
            target = ("msgstr", index)
    return [e for e in entries if e.msgid or e.msgctxt]  # the header has an empty msgid


def _problems(entries: list[Entry]) -> list[str]:
    return [
        f"{'fuzzy' if 'fuzzy' in e.flags else 'untranslated'}: {e.msgid!r}"
        for e in entries
        if not e.obsolete and ("fuzzy" in e.flags or not e.translated)
    ]


def test_the_shipped_catalogue_has_no_untranslated_or_fuzzy_message() -> None:
    assert _problems(po_entries(CATALOGUE)) == []


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("xgettext") is None, reason="needs GNU gettext (apt-get install gettext)")
def test_every_message_in_the_code_has_a_korean_translation(tmp_path: Path) -> None:
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.mo"))
        else:
            shutil.copy2(source, tmp_path / name)
    environment = {**os.environ, "PLATFORM_VAR_DIR": str(tmp_path / "var"), "PYTHONPATH": str(tmp_path)}
    subprocess.run(
        [sys.executable, "manage.py", "makemessages", "--locale", "ko", "--no-obsolete", "--verbosity", "0"],
        cwd=tmp_path,
        env=environment,
        check=True,
        capture_output=True,
        timeout=120,
    )
    problems = _problems(po_entries(tmp_path / "locale" / "ko" / "LC_MESSAGES" / "django.po"))
    assert problems == [], (
        "messages without a Korean translation (append them to locale/ko/LC_MESSAGES/django.po, then "
        "`manage.py compilemessages -l ko`):\n" + "\n".join(problems)
    )


def test_the_compiled_catalogue_matches_the_shipped_one() -> None:
    with (CATALOGUE.with_suffix(".mo")).open("rb") as compiled:
        catalogue = gettext.GNUTranslations(compiled)
    stale = []
    for entry in po_entries(CATALOGUE):
        if entry.obsolete or entry.msgid_plural or not entry.translated:
            continue
        key = f"{entry.msgctxt}\x04{entry.msgid}" if entry.msgctxt is not None else entry.msgid
        if catalogue._catalog.get(key) != entry.msgstr[0]:  # type: ignore[attr-defined]
            stale.append(entry.msgid)
    assert stale == [], "run `manage.py compilemessages -l ko`; not compiled yet: " + repr(stale[:10])


def test_django_s_garbled_korean_heading_reads_well(auditor_client) -> None:  # type: ignore[no-untyped-def]
    with translation.override("ko"):
        assert translation.gettext("Select %s to view") % "실행" == "조회할 실행 선택"
    page = auditor_client.get("/admin/agents/run/", HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    assert "조회할 실행 선택" in page and "보기위한" not in page


def test_the_dashboard_in_korean(admin_client) -> None:  # type: ignore[no-untyped-def]
    page = admin_client.get("/admin/", HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    assert "대기 중인 승인" in page and "최근 24시간의 실서비스 실행" in page
    # Django's own "Change" links read as Django translates them (a msgid of ours once took them over).
    assert re.search(r'class="changelink"[^>]*>변경</a>', page) and "변경 내용" not in page


def test_a_read_only_page_and_the_header_read_well_in_korean(auditor_client) -> None:  # type: ignore[no-untyped-def]
    from audit.services import audit_event_record

    event = audit_event_record(source="admin", tool="lookup", args={"이름": "김하늘"})
    page = auditor_client.get(f"/admin/audit/auditevent/{event.pk}/change/", HTTP_ACCEPT_LANGUAGE="ko").content
    text = page.decode()
    assert "감사 이벤트 보기" in text and "뷰 " not in text
    assert "에이전트 플랫폼 관리" in text and "Django" not in text
