"""Defect 3 of the Korean admin crawl: the README says the admin follows each reader's browser or language switch,
but there was no switch (no ``set_language`` URL: POST /i18n/setlang/ was a 404, and no page offered the form).
The admin's header now has a select of the platform's languages, each named in its own words, that posts to
``set_language`` with the current page as ``next``; the login page has it too.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client

pytestmark = pytest.mark.django_db

PASSWORD = "switch-Lang-2026"


def _language_form(page: str) -> str:
    found = re.search(r'<form id="language-form".*?</form>', page, re.S)
    assert found, "no language switch on the page"
    return found.group(0)


def _csrf_token(form: str) -> str:
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
    assert found
    return found.group(1)


@pytest.fixture
def admin_with_csrf() -> Client:
    """A logged-in superuser whose client checks CSRF tokens as a browser's requests are checked."""
    get_user_model().objects.create_superuser("switcher", "switcher@example.com", PASSWORD)
    client = Client(enforce_csrf_checks=True)
    client.login(username="switcher", password=PASSWORD)
    return client


def test_the_admin_header_offers_each_language_in_its_own_words(admin_with_csrf: Client) -> None:
    page = admin_with_csrf.get("/admin/agents/agent/", HTTP_ACCEPT_LANGUAGE="en").content.decode()

    form = _language_form(page)
    assert 'action="/i18n/setlang/"' in form and 'method="post"' in form
    assert '<input type="hidden" name="next" value="/admin/agents/agent/">' in form
    options = re.findall(r'<option value="(\w+)" lang="\w+"( selected)?>([^<]+)</option>', form)
    assert options == [("en", " selected", "English"), ("ko", "", "한국어")]
    assert [code for code, _name in settings.LANGUAGES] == ["en", "ko"]
    assert "<noscript><button" in form  # a reader without scripts submits with the button
    # What the header had before stays: the logout form and the theme toggle.
    assert 'id="logout-form"' in page and 'class="theme-toggle"' in page


def test_choosing_korean_makes_the_next_admin_page_korean(admin_with_csrf: Client) -> None:
    page = admin_with_csrf.get("/admin/agents/agent/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    token = _csrf_token(_language_form(page))

    answer = admin_with_csrf.post(
        "/i18n/setlang/",
        {"language": "ko", "next": "/admin/agents/agent/", "csrfmiddlewaretoken": token},
        HTTP_ACCEPT_LANGUAGE="en",
    )

    assert answer.status_code == 302 and answer["Location"] == "/admin/agents/agent/"
    # The choice outlasts the browser's own language: the next page is Korean though the browser asks for English.
    korean = admin_with_csrf.get(answer["Location"], HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert '<html lang="ko"' in korean
    assert "에이전트 플랫폼 관리" in korean
    assert re.search(r'<option value="ko" lang="ko" selected>한국어</option>', _language_form(korean))

    back = admin_with_csrf.post(
        "/i18n/setlang/",
        {"language": "en", "next": "/admin/", "csrfmiddlewaretoken": _csrf_token(_language_form(korean))},
    )
    english = admin_with_csrf.get(back["Location"], HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    assert '<html lang="en"' in english and "Agent platform administration" in english


def test_the_login_page_has_the_switch_too(client: Any) -> None:
    page = client.get("/admin/login/?next=/admin/").content.decode()

    form = _language_form(page)
    assert '<input type="hidden" name="next" value="/admin/login/?next=/admin/">' in form

    client.post("/i18n/setlang/", {"language": "ko", "next": "/admin/login/?next=/admin/"})
    assert '<html lang="ko"' in client.get("/admin/login/?next=/admin/").content.decode()


def test_the_switch_never_leads_off_the_site(admin_with_csrf: Client) -> None:
    """``next`` is Django's to check: an address on another host is not followed."""
    page = admin_with_csrf.get("/admin/").content.decode()

    answer = admin_with_csrf.post(
        "/i18n/setlang/",
        {"language": "ko", "next": "https://evil.example/", "csrfmiddlewaretoken": _csrf_token(_language_form(page))},
    )

    assert answer.status_code == 302 and "evil.example" not in answer["Location"]


def test_the_switch_is_no_part_of_the_api() -> None:
    from agent_platform.body_limit import is_api_path

    assert not is_api_path("/i18n/setlang/")


def test_the_password_pages_offer_the_switch_too(admin_with_csrf: Client) -> None:
    """Django's password pages replace the header's links: the switch was missing there."""
    for path in ("/admin/password_change/", "/admin/password_change/done/"):
        page = admin_with_csrf.get(path).content.decode()
        assert "/i18n/setlang/" in _language_form(page), path
        assert page.count('id="language-form"') == 1, path
