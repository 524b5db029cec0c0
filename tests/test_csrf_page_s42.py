"""A form whose CSRF check failed (its cookie lost) gets the platform's page in the reader's language: Django's own
had an English "403 Forbidden" title and heading on a Korean body."""

from __future__ import annotations

import pytest
from django.test import Client


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("language", "heading", "advice"),
    [
        ("en", "The form could not be sent", "Reload the page and send the form again."),
        ("ko", "양식을 보내지 못했습니다", "페이지를 새로 고친 뒤 양식을 다시 보내세요."),
    ],
)
def test_a_form_sent_without_its_csrf_cookie_is_told_in_the_readers_language(language, heading, advice) -> None:
    page = Client(enforce_csrf_checks=True).post(
        "/admin/login/", {"username": "admin", "password": "x"}, HTTP_ACCEPT_LANGUAGE=language
    )
    text = page.content.decode()
    assert page.status_code == 403
    assert f"<h1>{heading}</h1>" in text and advice in text
    assert "Forbidden" not in text and "<p></p>" not in text  # Django gives this template no context
