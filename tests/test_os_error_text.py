"""A command's operating system error in the reader's language: ``OSError.strerror`` is the C library's English
("No such file or directory") in the middle of a Korean sentence."""

from __future__ import annotations

import errno
import io
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.utils import translation

from agent_platform.os_errors import os_error_text

pytestmark = pytest.mark.django_db


def test_import_config_names_a_missing_file_in_korean(tmp_path: Path) -> None:
    missing = tmp_path / "없는-설정.json"
    with translation.override("ko"), pytest.raises(CommandError) as refused:
        call_command("import_config", str(missing), stdout=io.StringIO())
    message = str(refused.value)
    assert str(missing) in message
    assert "No such file" not in message
    with translation.override("ko"):
        assert os_error_text(FileNotFoundError(errno.ENOENT, "No such file or directory")) in message


def test_export_config_names_a_folder_given_as_its_file_in_korean(tmp_path: Path, demo_agent) -> None:
    with translation.override("ko"), pytest.raises(CommandError) as refused:
        call_command("export_config", "--output", str(tmp_path), stdout=io.StringIO(), stderr=io.StringIO())
    assert "Is a directory" not in str(refused.value)
    with translation.override("ko"):
        assert os_error_text(IsADirectoryError(errno.EISDIR, "Is a directory")) in str(refused.value)


def test_an_error_it_does_not_know_keeps_the_systems_words() -> None:
    with translation.override("ko"):
        assert os_error_text(OSError(errno.EIO, "Input/output error")) == "Input/output error"
        assert os_error_text(OSError("no errno at all")) == "no errno at all"
