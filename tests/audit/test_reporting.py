"""Django's error reports and debug pages never show credentials."""

from __future__ import annotations

import sys

from django.test import RequestFactory
from django.views.debug import ExceptionReporter

# Built at run time, so the report's source excerpts (which show this file's lines) cannot contain them.
DB_PASSWORD = "-".join(["hunter2", "db", "password"])
REDIS_PASSWORD = "-".join(["redis", "pass", "9f8e7d"])
FORM_PASSWORD = "-".join(["p@ssw0rd", "form"])
FRAME_TOKEN = "sk-live-" + "abcdefghij" * 2


def fail_with_a_token_in_a_local_variable() -> None:
    api_token = FRAME_TOKEN  # noqa: F841 - a frame variable the report shows
    raise RuntimeError("boom")


def test_an_error_report_hides_database_and_redis_urls_and_masks_frame_values(settings) -> None:
    settings.DATABASE_URL = f"postgres://platform:{DB_PASSWORD}@db.internal:5432/platform"
    settings.REDIS_URL = f"redis://:{REDIS_PASSWORD}@cache.internal:6379/0"
    settings.CELERY_BROKER_URL = settings.REDIS_URL
    request = RequestFactory().post("/api/v1/runs", {"password": FORM_PASSWORD, "query": "김하늘"})
    try:
        fail_with_a_token_in_a_local_variable()
    except RuntimeError:
        reporter = ExceptionReporter(request, *sys.exc_info())
        pages = [reporter.get_traceback_html(), reporter.get_traceback_text()]
    for page in pages:
        for secret in (DB_PASSWORD, REDIS_PASSWORD, FORM_PASSWORD, FRAME_TOKEN):
            assert secret not in page
    assert "DATABASE_URL" in pages[0]  # named, not shown
