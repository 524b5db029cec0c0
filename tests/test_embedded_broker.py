"""The embedded broker (``agent_platform.embedded_broker``): a worker takes a message whole or not at all, and
only one worker takes it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from kombu import Connection

from agent_platform import embedded_broker
from agent_platform.embedded_broker import TEMPORARY_SUFFIX


@pytest.fixture
def folders(tmp_path: Path) -> dict[str, str]:
    for name in ("queue", "processed", "control"):
        (tmp_path / name).mkdir()
    return {
        "data_folder_in": str(tmp_path / "queue"),
        "data_folder_out": str(tmp_path / "queue"),
        "processed_folder": str(tmp_path / "processed"),
        "control_folder": str(tmp_path / "control"),
        "store_processed": False,
    }


@pytest.fixture
def channels(folders: dict[str, str]) -> Iterator[tuple[Any, Any]]:
    """Two consumers' channels on one broker folder (two worker processes)."""
    with (
        Connection("filesystem://", transport=embedded_broker.Transport, transport_options=folders) as first,
        Connection("filesystem://", transport=embedded_broker.Transport, transport_options=folders) as second,
    ):
        yield first.default_channel, second.default_channel


def test_a_message_is_taken_whole_and_once(channels: tuple[Any, Any], folders: dict[str, str]) -> None:
    first, second = channels
    first._put("celery", {"run_id": "r1", "query": "김하늘 님은 어느 팀 소속인가요?"})
    assert [n for n in os.listdir(folders["data_folder_in"]) if n.endswith(TEMPORARY_SUFFIX)] == []
    assert second._get("celery") == {"run_id": "r1", "query": "김하늘 님은 어느 팀 소속인가요?"}
    with pytest.raises(Empty):
        first._get("celery")
    assert os.listdir(folders["processed_folder"]) == []  # not kept (store_processed off)


def test_a_message_still_being_written_is_not_taken(channels: tuple[Any, Any], folders: dict[str, str]) -> None:
    first, _second = channels
    partial = Path(folders["data_folder_in"]) / f"1_abc.celery.msg{TEMPORARY_SUFFIX}"
    partial.write_bytes(b'{"run_id": ')  # a publisher in the middle of its write
    with pytest.raises(Empty):
        first._get("celery")
    assert partial.exists()


def test_two_workers_that_list_the_same_message_do_not_both_take_it(
    channels: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interleaving: the first worker lists the folder, the second takes the message, then the first tries."""
    first, second = channels
    first._put("celery", {"run_id": "r1"})
    taken_by_second: list[Any] = []
    real_listdir = os.listdir

    def listdir_then_the_other_worker_takes_it(path: str) -> list[str]:
        names = real_listdir(path)
        if not taken_by_second:
            monkeypatch.setattr(embedded_broker.os, "listdir", real_listdir)
            taken_by_second.append(second._get("celery"))
        return names

    monkeypatch.setattr(embedded_broker.os, "listdir", listdir_then_the_other_worker_takes_it)
    with pytest.raises(Empty):
        first._get("celery")
    assert taken_by_second == [{"run_id": "r1"}]


def test_the_embedded_default_uses_it_and_polls_often() -> None:
    from django.conf import settings

    if not settings.CELERY_BROKER_URL.startswith("filesystem://"):
        pytest.skip("the tests run on another broker")
    assert settings.CELERY_BROKER_TRANSPORT == "agent_platform.embedded_broker:Transport"
    assert settings.CELERY_BROKER_TRANSPORT_OPTIONS["polling_interval"] <= 0.02
