"""A known secret disguised by characters a reader does not tell apart is masked: full-width or other
compatibility forms (NFKC), and zero-width or other characters that do not show themselves between its letters
(``audit.visible``'s set); a run of one invisible character is written once with its count."""

from __future__ import annotations

import pytest

from audit.masking import mask_known, mask_text
from audit.visible import invisible_characters, visible_text

TOKEN = "bkTok5e1f0c9a7d3b"
FULL_WIDTH = "".join(chr(ord(c) + 0xFEE0) for c in TOKEN)


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        (f"결과: 토큰 {FULL_WIDTH} 입니다", "결과: 토큰 *** 입니다"),
        (f"backend refused token {FULL_WIDTH}", "backend refused token ***"),
        ("결과: " + "\u200b".join(TOKEN), "결과: ***"),
        ("x" + "\u00ad".join(TOKEN) + "y", "x***y"),  # soft hyphens
        (TOKEN[:4] + "\u2063\u2060" + TOKEN[4:] + " 끝", "*** 끝"),  # invisible separator, word joiner
        (TOKEN[:4] + "\U000e0041" + TOKEN[4:], "***"),  # a tag character
        (TOKEN[:4] + "\u3164" + TOKEN[4:], "***"),  # a Hangul filler
        ("\u200b".join(FULL_WIDTH), "***"),  # both at once
        ("㎏ " + FULL_WIDTH[:3] + "\u200d" + FULL_WIDTH[3:] + " ㎏", "㎏ *** ㎏"),  # "㎏" folds to two characters
        ("😀 " + TOKEN[:3] + "\ufeff" + TOKEN[3:], "😀 ***"),
        ("ok " + "\u200b".join(TOKEN[:8]) + "\n" + TOKEN[8:] + " end", "ok *** end"),  # split over lines too
        (TOKEN[:5] + "\x07" + TOKEN[5:] + "\n", "***\n"),  # an ASCII control character
    ],
)
def test_a_disguised_secret_is_masked(text: str, masked: str) -> None:
    assert mask_text(text, secrets=[TOKEN]) == masked
    assert mask_known({"v": [text]}, secrets=[TOKEN]) == {"v": [masked]}


def test_what_is_not_the_secret_is_kept() -> None:
    text = "ＡＢＣ 전각 ㎏ 👩\u200d💻 결과\u200b입니다 " + FULL_WIDTH[:8]  # part of it only
    assert mask_text(text, secrets=[TOKEN]) == text


def test_a_run_of_one_invisible_character_is_written_once() -> None:
    flood = "ok" + "\U000e0041" * 19000
    assert visible_text(flood) == "ok⟦U+E0041 ×19000⟧"
    assert visible_text("a\u200bb" + "\u200b" * 3 + "c" + "\u200b" * 4) == (
        "a⟦U+200B⟧b⟦U+200B⟧⟦U+200B⟧⟦U+200B⟧c⟦U+200B ×4⟧"
    )
    # Tag characters spelling a word stay one by one (an auditor reads them), as does what selects something.
    assert visible_text("팀장" + "".join(chr(0xE0000 + ord(c)) for c in "IGG")) == "팀장⟦U+E0049⟧⟦U+E0047⟧⟦U+E0047⟧"
    assert visible_text("❤️ 1️⃣ plain\r\n") == "❤️ 1️⃣ plain⟦U+000D⟧\n"
    assert invisible_characters("a\u200b\u200bb\u202e") == ["\u200b", "\u202e"]


@pytest.mark.parametrize(
    "text",
    [
        "키는 bkTok9\u200b\nxQ2mZ7pL 입니다",  # a hidden character at the end of a line
        "키는 bkTok9\u00ad\nxQ2mZ7pL 입니다",  # a soft hyphen where the line was wrapped
        "키는 bkTok9\n\u200bxQ2mZ7pL 입니다",
        "키는 bkTok9\u200b \u200bxQ2mZ7pL 입니다",
    ],
)
def test_a_secret_split_over_a_line_with_a_hidden_character_beside_the_break_is_masked(text: str) -> None:
    assert mask_text(text, secrets=["bkTok9xQ2mZ7pL"]) == "키는 *** 입니다"


def test_a_korean_secret_with_hidden_characters_between_its_letters_is_masked() -> None:
    secret = "비밀정보한글토큰값"
    disguised = "\u200b".join(secret)
    assert mask_text(f"값: {disguised} 끝", secrets=[secret]) == "값: *** 끝"
    assert mask_text("값: 비밀이 아닌 글 끝", secrets=[secret]) == "값: 비밀이 아닌 글 끝"


def test_a_flood_of_hidden_characters_is_read_once_not_once_per_character() -> None:
    """Each hidden character of a run looked back and forth over the whole run: 19,000 tag characters took 80 s to
    mask (a bound against that blow-up, not a timing)."""
    import time

    started = time.perf_counter()
    assert mask_text("ok" + "\U000e0041" * 40_000, secrets=["bkTok5e1f0c9a7d3b"]).startswith("ok")
    assert time.perf_counter() - started < 10
