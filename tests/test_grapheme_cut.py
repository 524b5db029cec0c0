"""An agent's description on its A2A card and in MCP ``tools/list`` is its prompt's first line, cut: by code point,
a syllable typed decomposed read as another (김 cut after ᅵ reads 기) and an emoji joined by ZWJ was split, a bare
joiner left at the end. Cut composed, on a boundary a reader sees. And ``/metrics``' refusal is readable Korean."""

from __future__ import annotations

import unicodedata

import pytest

from agent_platform.text import grapheme_cut
from agents.api.a2a_server import prompt_summary


def test_a_decomposed_syllable_is_composed_before_the_cut_and_never_cut_inside() -> None:
    prompt = unicodedata.normalize("NFD", "가" * 149 + "김하늘 팀장에게 물어보세요")
    summary = prompt_summary(prompt, secrets=[], max_chars=150)
    assert summary == "가" * 149 + "김"


def test_an_emoji_joined_by_zwj_is_kept_whole_or_left_out() -> None:
    assert grapheme_cut("가" * 3 + "👩\u200d💻" + "다", 5) == "가" * 3
    assert grapheme_cut("가" * 3 + "👩\u200d💻" + "다", 6) == "가" * 3 + "👩\u200d💻"
    assert grapheme_cut("e\u0301" * 3, 4) == "é" * 3  # composed: three characters


@pytest.mark.django_db
def test_the_metrics_refusal_is_readable_korean(client, settings) -> None:
    settings.PLATFORM_METRICS_ALLOWED_NETWORKS = []
    response = client.get("/metrics", HTTP_ACCEPT_LANGUAGE="ko")
    assert response.status_code == 403
    assert "\\u" not in response.content.decode() and "메트릭" in response.content.decode()
