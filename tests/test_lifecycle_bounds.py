"""A run-lifecycle number that can never work stops the process at start, naming the variable (the README review:
``PLATFORM_RUN_MAX_TIME_LIMIT_S=0`` passed ``check`` and /readyz, then failed every run with ``time_limit``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_ops_production import platform_process

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("PLATFORM_RUN_MAX_TIME_LIMIT_S", "0", "of 1 or more"),
        ("PLATFORM_RUN_TIME_LIMIT_GRACE_S", "-5", "of 1 or more"),
        ("PLATFORM_RUN_MAX_DELIVERIES", "0", "of 1 or more"),
        ("PLATFORM_RECONCILE_BATCH", "0", "of 1 or more"),
        ("CELERY_VISIBILITY_TIMEOUT_S", "0", "of 1 or more"),
        ("PLATFORM_WORKER_DB_CONN_MAX_AGE", "-1", "of 0 or more"),
    ],
)
def test_a_lifecycle_number_that_cannot_work_is_refused_at_start(
    name: str, value: str, said: str, tmp_path: Path
) -> None:
    done = platform_process("", tmp_path, **{name: value})

    assert done.returncode != 0
    assert f"{name} must be a whole number {said}, not '{value}'" in done.stderr


def test_the_smallest_working_numbers_are_taken(tmp_path: Path) -> None:
    script = "from django.conf import settings; print(settings.PLATFORM_RUN_MAX_TIME_LIMIT_S, settings.PLATFORM_WORKER_DB_CONN_MAX_AGE)"
    done = platform_process(script, tmp_path, PLATFORM_RUN_MAX_TIME_LIMIT_S="1", PLATFORM_WORKER_DB_CONN_MAX_AGE="0")

    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["1", "0"]
