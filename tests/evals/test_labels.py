"""An eval run's failed checks and missed thresholds in words, with their codes (evals/labels.py)."""

from __future__ import annotations

import pytest
from django.utils import translation

from evals.labels import check_label, checks_html, threshold_html


@pytest.mark.parametrize(
    ("code", "english", "korean"),
    [
        ("tools:mismatch", "not the expected tools", "기대한 도구와 다름"),
        ("tools:forbidden", "called a tool it must not", "호출하면 안 되는 도구를 호출함"),
        ("tools:order", "the expected tools in another order", "기대한 도구를 다른 순서로 호출함"),
        ("tools:args", "not the expected arguments", "기대한 인자와 다름"),
        ("run:failed", "the run failed", "실행 실패"),
        ("eval:timeout", "stopped at the eval's time limit", "평가 시간 제한에 걸려 중단됨"),
        ("dont_know", "the answer does not say it does not know", "답변이 모른다고 말하지 않음"),
        ("contains:클라우드운영팀", "the answer lacks “클라우드운영팀”", "답변에 “클라우드운영팀”이(가) 없음"),
        ("regex:A-[0-9]{4}", "the answer does not match A-[0-9]{4}", "답변이 A-[0-9]{4} 패턴과 맞지 않음"),
        ("tools:something_new", "tools:something_new", "tools:something_new"),  # unknown: as it is
    ],
)
def test_a_failed_check_in_words(code: str, english: str, korean: str) -> None:
    with translation.override("en"):
        assert check_label(code) == english
    with translation.override("ko"):
        assert check_label(code) == korean


def test_checks_are_escaped_and_carry_their_codes() -> None:
    with translation.override("en"):
        html = str(checks_html(["contains:<b>팀</b>", "tools:mismatch"]))
    assert "<b>" not in html and "&lt;b&gt;팀&lt;/b&gt;" in html
    assert html.count('class="eval-check"') == 2
    assert 'not the expected tools <code class="eval-code">tools:<wbr>mismatch<wbr></code>' in html


def test_a_missed_threshold_names_its_score() -> None:
    with translation.override("ko"):
        assert (
            str(threshold_html("recall 0.6 < 0.75"))
            == '도구 재현율 0.6 &lt; 0.75 <code class="eval-code">recall</code>'
        )
        assert "금지 도구 호출 위반 2 &gt; 0" in str(threshold_html("forbidden_violations 2 > 0"))
    # Anything else (written by an older version) is shown as it was stored, escaped.
    assert str(threshold_html("custom <score> 1 < 2")) == "custom &lt;score&gt; 1 &lt; 2"
