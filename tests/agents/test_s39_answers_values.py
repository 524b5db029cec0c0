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
