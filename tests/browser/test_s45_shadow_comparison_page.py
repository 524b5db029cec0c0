"""A shadow comparison's page in a real browser at 1,280 and 800 px, in English and Korean (review s45): the two
runs side by side where they fit (one under the other where they do not), a long answer and a long argument
wrapped in their column; nothing on the page scrolls sideways."""

from __future__ import annotations

from typing import Any

import pytest

from agents.execution import run_execute
from agents.models import Run, ShadowComparison
from tests.agents.test_shadow import live_run, with_candidate
from tests.browser.conftest import pages_in_both_languages
from tests.conftest import bind_demo_server, make_agent

pytestmark = pytest.mark.browser

LONG_ANSWER = (
    "A-1001 자산은 현재 사용 중이며 사용자는 김하늘 님입니다. 반납 예정일은 다음 달 말입니다. " * 6
    + "띄어쓰기없이길게이어지는답변입니다" * 12
    + " https://wiki.example.com/assets/"
    + "A-1001-maintenance-history-" * 8
)


@pytest.fixture
def comparison(transactional_db: Any) -> ShadowComparison:
    agent = make_agent(slug="company-assistant", servers=[bind_demo_server()])
    with_candidate(agent, "후보 답변: {result.asset_id} 자산")
    run = live_run(agent)
    run_execute(run_id=str(Run.objects.get(shadow_of=run).id))
    found = ShadowComparison.objects.get(live_run=run)
    Run.objects.filter(pk=found.shadow_run_id).update(answer=LONG_ANSWER)
    return found


def test_a_comparisons_page_never_scrolls_sideways_and_sets_the_runs_side_by_side_where_they_fit(
    admin_in_browser: Any, comparison: ShadowComparison
) -> None:
    browser = admin_in_browser
    wider, placed, answers = {}, {}, {}
    for language, width in pages_in_both_languages(
        browser, f"/admin/agents/shadowcomparison/{comparison.pk}/change/", "shadow-comparison"
    ):
        found = browser.execute_script(
            """const sides = [...document.querySelectorAll('.shadow-side')].map(s => s.getBoundingClientRect());
            const answers = [...document.querySelectorAll('.shadow-answer')];
            return {page: document.documentElement.scrollWidth, window: window.innerWidth,
                    tops: sides.map(b => Math.round(b.top)),
                    answers: answers.map(a => [a.scrollWidth, a.clientWidth, a.textContent.length])};"""
        )
        if found["page"] > found["window"]:
            wider[(language, width)] = (found["page"], found["window"])
        placed[(language, width)] = len(set(found["tops"])) == 1  # one beside the other
        answers[(language, width)] = found["answers"]
    assert wider == {}
    assert placed[("en", 1280)] and placed[("ko", 1280)]
    for shown in answers.values():
        assert len(shown) == 2 and shown[1][2] == len(LONG_ANSWER)
        assert all(scroll <= client for scroll, client, _length in shown)  # wrapped, not cut or scrolled
