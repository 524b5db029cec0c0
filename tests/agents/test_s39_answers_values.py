"""An answer composed without a model writes out what does not show itself in the values it quotes (a tool's
value, the query), never in the agent's own template words."""

from __future__ import annotations

from agents.answers import compose_offline_answer
from agents.deterministic import render_answer

TAGGED = "김하늘 팀장" + "".join(chr(0xE0000 + ord(c)) for c in "IG")
SHOWN = "김하늘 팀장⟦U+E0049⟧⟦U+E0047⟧"


def test_a_template_writes_out_its_values() -> None:
    value = {"owner": TAGGED, "names": [TAGGED]}
    template = "👩\u200d💻 {result.owner} / {result.names} / {query}"
    answer = render_answer(template, query="누구\u200b?", match={}, params={}, value=value)
    assert answer == f"👩\u200d💻 {SHOWN} / {SHOWN} / 누구⟦U+200B⟧?"
    assert render_answer("담당: {result}", query="", match={}, params={}, value=TAGGED) == f"담당: {SHOWN}"
    # A placeholder without a value: the tool's own text is the answer, written out too.
    assert render_answer("{result.missing}", query="", match={}, params={}, value=TAGGED) == SHOWN


def test_an_offline_answer_writes_out_its_values() -> None:
    results = [{"ok": True, "tool": "who", "value": TAGGED, "args": {}}]
    answer = compose_offline_answer(
        query="q", results=results, answer_template="\u2063{results}", no_match_text="", language="ko"
    )
    assert answer == f"\u2063who: {SHOWN}"


def test_a_value_s_line_ends_and_emoji_read_as_written_and_a_joiner_between_letters_is_written_out() -> None:
    """Answers are read by people: ``\\r\\n`` (a browser form's line end) read ``행1⟦U+000D⟧``, and an emoji joined
    by a zero-width joiner (``👩‍💻``, ``🏳️‍🌈``) lost its join; a joiner between letters hides nothing less for that."""
    from audit.visible import readable_text

    assert readable_text("행1\r\n행2") == "행1\n행2"
    assert readable_text("👩\u200d💻 🏳️\u200d🌈 👍🏽") == "👩\u200d💻 🏳️\u200d🌈 👍🏽"
    assert readable_text("a\u200db 행\u200d1 \r끝") == "a⟦U+200D⟧b 행⟦U+200D⟧1 ⟦U+000D⟧끝"
    answer = render_answer("{query}: {result}", query="👩\u200d💻 찾아줘", match={}, params={}, value="개발팀\r\n")
    assert answer == "👩\u200d💻 찾아줘: 개발팀\n"
