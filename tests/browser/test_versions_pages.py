"""The admin pages of versions, A/B arms and shadow runs in a real Chromium, in English and in Korean: the versions
list, a version's frozen content in words and a diff between two versions, the arms' metrics with their charts, and the shadow comparisons with the
disagreements first. Each page is saved as a picture under ``$PLATFORM_VAR_DIR/screenshots/`` for a person to look
at; with ``PLATFORM_README_PICTURES=1`` the English ones also go to ``docs/screenshots/`` for the README."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from agents.execution import run_execute
from agents.models import Agent, AgentVersion, DeterministicRule, Run, ShadowComparison
from agents.services import (
    agent_arm_create,
    agent_shadow_set,
    agent_version_publish,
    api_key_create,
    deterministic_rule_update,
    run_create,
    run_feedback_record,
)
from tests.browser.conftest import screenshot
from tests.conftest import bind_demo_server, make_agent

pytestmark = pytest.mark.browser

PICTURES = Path(settings.BASE_DIR) / "docs" / "screenshots"
QUERIES = ["A-1001 자산의 현재 상태를 알려주세요.", "김하늘 님은 어느 팀 소속인가요?", "A-1002 자산 상태는요?"]


@pytest.fixture
def experiment(transactional_db: Any) -> Agent:
    """v1 live (arm ``a``); v2, whose asset rule answers differently, the shadow candidate of every live run and
    arm ``b``; a dozen callers' runs with their shadows compared and a few rated."""
    agent = make_agent(slug="company-assistant", servers=[bind_demo_server()])
    v1 = agent_version_publish(agent=agent, actor="admin", via="admin", note="규칙 그대로")
    rule = DeterministicRule.objects.get(agent=agent, tool_name="get_asset_status")
    deterministic_rule_update(
        rule=rule, actor="admin", via="admin", data={"answer_template": "{result.asset_id} 상태: {result.status}"}
    )
    v2 = agent_version_publish(agent=agent, actor="admin", via="admin", note="자산 답변 문구 변경", make_live=False)
    agent.refresh_from_db()
    agent_shadow_set(agent=agent, actor="admin", via="admin", version=v2, rate=1.0)
    agent_arm_create(actor="admin", via="admin", data={"agent": agent, "name": "a", "version": v1, "weight": 1})
    agent_arm_create(actor="admin", via="admin", data={"agent": agent, "name": "b", "version": v2, "weight": 1})
    key, _raw = api_key_create(name="browser-test caller", actor="admin", via="admin")
    for i in range(12):
        run = run_create(
            agent_slug=agent.slug, query=QUERIES[i % len(QUERIES)], api_key=key, context={"userId": f"E-{i:03d}"}
        )
        run_execute(run_id=str(run.id))
        run.refresh_from_db()
        if i % 2 == 0:
            run_feedback_record(run=run, score=5 - i % 3, scale="five", comment="", actor=f"api_key:{key.prefix}")
    for shadow in Run.objects.filter(purpose=Run.Purpose.SHADOW, status=Run.Status.QUEUED):
        run_execute(run_id=str(shadow.id))
    # Arm b's runs ran the candidate already: not shadowed on it (they agreed with themselves); arm a's are.
    on_v1 = Run.objects.filter(purpose=Run.Purpose.LIVE, version=v1).count()
    assert 0 < on_v1 < 12 and ShadowComparison.objects.count() == on_v1
    assert (
        ShadowComparison.objects.filter(agrees=False).exists() and ShadowComparison.objects.filter(agrees=True).exists()
    )
    assert set(Run.objects.filter(purpose=Run.Purpose.LIVE).values_list("arm", flat=True)) == {"a", "b"}
    return agent


def in_language(browser: Any, language: str) -> None:
    """The admin in ``language``: Django's language cookie, as the admin's language switch sets it."""
    browser.get(f"{browser.base_url}/admin/")
    browser.add_cookie({"name": settings.LANGUAGE_COOKIE_NAME, "value": language, "path": "/"})


def page(browser: Any, path: str, name: str, *, readme: str = "") -> str:
    """Load ``path``, save the whole page as a picture (and as the README's ``readme`` picture when asked for),
    return its visible text."""
    from selenium.webdriver.common.by import By

    browser.set_window_size(1440, 900)
    browser.get(f"{browser.base_url}{path}")
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1440, min(max(height + 40, 900), 2400))
    screenshot(browser, name)
    if readme and os.environ.get("PLATFORM_README_PICTURES") == "1":
        print(screenshot(browser, readme, PICTURES))
    return str(browser.find_element(By.TAG_NAME, "body").text)


def no_horizontal_overflow(browser: Any) -> None:
    """The content fits the window: no table pushes the page, or the box it sits in, sideways."""
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1")
    overflowing = browser.execute_script(
        "return [...document.querySelectorAll('#content table')]"
        ".filter(t => t.parentElement.scrollWidth > t.parentElement.clientWidth + 1).length"
    )
    assert overflowing == 0


TEXT = {
    "en": {
        "versions": ["Agent versions", "against the previous version", "규칙 그대로", "자산 답변 문구 변경"],
        "version": ["System prompt", "rules, in order", "any of these keywords:", "on failure:", "up to 3 attempts"],
        "diff": ["company-assistant v2 compared with v1", "Compare with", "rules."],
        "arms": ["A/B arms of company-assistant", "success rate", "tool-citation rate", "two-proportion z-test"],
        "shadow": ["Shadow comparisons", "AGREES", "WHAT DIFFERS", "ANSWER SIMILARITY", "Δ LATENCY", "answer", " ms"],
    },
    "ko": {
        "versions": ["에이전트 버전", "이전 버전과 비교", "규칙 그대로"],
        "version": ["시스템 프롬프트", "규칙 (순서대로)", "실패하면:", "최대 3회 시도"],
        "diff": ["company-assistant v2와 v1 비교", "rules."],
        "arms": ["company-assistant의 A/B 실험군", "성공률"],
        "shadow": ["섀도 비교", "일치", "다른 점", "답변 유사도", "Δ 지연", "답변"],
    },
}


@pytest.mark.parametrize("language", ["en", "ko"])
def test_the_versions_arms_and_shadow_pages_render_in_english_and_korean(
    experiment: Agent, admin_in_browser: Any, language: str
) -> None:
    from selenium.webdriver.common.by import By

    browser = admin_in_browser
    in_language(browser, language)
    expected = TEXT[language]
    english = language == "en"

    text = page(browser, "/admin/agents/agentversion/", f"versions-list-{language}")
    for shown in expected["versions"]:
        assert shown in text, shown
    assert len(browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")) == 2
    no_horizontal_overflow(browser)

    v2 = AgentVersion.objects.get(agent=experiment, number=2)
    text = page(
        browser,
        f"/admin/agents/agentversion/{v2.pk}/change/",
        f"version-content-{language}",
        readme="version-content" if english else "",
    )
    for shown in expected["version"]:
        assert shown in text, shown
    assert "{result.asset_id} 상태: {result.status}" in text
    assert not browser.find_element(By.CSS_SELECTOR, "details.version-json").get_attribute("open")  # JSON folded
    no_horizontal_overflow(browser)

    text = page(
        browser,
        f"/admin/agents/agentversion/{v2.pk}/diff/",
        f"versions-diff-{language}",
        readme="versions-diff" if english else "",
    )
    for shown in expected["diff"]:
        assert shown in text, shown
    assert "{result.asset_id} 상태: {result.status}" in text  # the changed template, readable (not \\u escapes)
    no_horizontal_overflow(browser)

    text = page(
        browser,
        f"/admin/agents/agentarm/metrics/?agent={experiment.slug}",
        f"ab-arms-{language}",
        readme="ab-arms" if english else "",
    )
    for shown in expected["arms"]:
        assert shown in text, shown
    assert len(browser.find_elements(By.CSS_SELECTOR, "svg.chart")) == 5
    assert len(browser.find_elements(By.CSS_SELECTOR, "#content table tbody tr")) == 2
    no_horizontal_overflow(browser)

    text = page(
        browser,
        "/admin/agents/shadowcomparison/",
        f"shadow-comparisons-{language}",
        readme="shadow-comparisons" if english else "",
    )
    for shown in expected["shadow"]:
        assert shown in text, shown
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == ShadowComparison.objects.count()
    # Disagreements first: the first row's "agrees" icon is a no.
    assert rows[0].find_element(By.CSS_SELECTOR, "td.field-agrees img").get_attribute("alt") == "False"
    no_horizontal_overflow(browser)
