"""A management command speaks the platform's language (LANGUAGE_CODE): its help, its progress and its errors come
from the Korean catalogue when the platform runs in Korean, and stay English by default."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import translation


@pytest.mark.django_db
def test_a_command_prints_in_the_platforms_language() -> None:
    out = io.StringIO()
    with override_settings(LANGUAGE_CODE="ko"), translation.override("ko"):
        call_command("expire_approvals", stdout=out)
        with pytest.raises(CommandError) as refused:
            call_command("run_query", "nobody", "안녕", "--context", "[1]")
    assert out.getvalue().strip() == "승인 0건 만료됨"
    assert str(refused.value) == "--context는 JSON 객체여야 함"
    english = io.StringIO()
    call_command("expire_approvals", stdout=english)
    assert english.getvalue().strip() == "expired 0 approval(s)"


def test_a_commands_help_is_in_the_platforms_language() -> None:
    from django.core.management import load_command_class

    command = load_command_class("agents", "create_api_key")
    with translation.override("ko"):
        text = command.create_parser("manage.py", "create_api_key").format_help()
    assert "API 키를 발급합니다." in text and "쉼표로 구분" in text


@pytest.mark.django_db
def test_the_demos_password_line_keeps_the_prefix_bin_up_reads_in_any_language() -> None:
    """bin/up shows the admin password from the line that starts ``admin password:`` and keeps that line out of
    var/seed_demo.log: in Korean too (a translated prefix put the password in the log)."""
    from agents.management.commands.seed_demo import Command

    out = io.StringIO()
    command = Command(stdout=out)
    with (
        override_settings(LANGUAGE_CODE="ko", PLATFORM_DEMO_ADMIN_PASSWORD="demo-Pass-2026"),
        translation.override("ko"),
    ):
        command._admin("admin")
    lines = out.getvalue().splitlines()
    assert "admin password: demo-Pass-2026" in lines
    assert "관리자 사용자: admin" in lines  # the rest speaks the platform's language
