"""A secret not in ASCII (Korean, or Korean with ASCII letters) with hidden characters between its letters, or its
ASCII letters in full-width form, is masked wherever it stands, whatever other disguise the text holds elsewhere:
a full-width digit or a zero-width space between two ASCII letters elsewhere once left it in clear."""

from __future__ import annotations

import time
import unicodedata

import pytest

from audit.masking import mask_known, mask_text

SECRET = "비밀정보한글토큰값"
MIXED = "토큰ABC123"
TOKEN = "bkTok5e1f0c9a7d3b"
ZWSP, SHY = "\u200b", "\u00ad"  # zero-width space, soft hyphen
HIDDEN = ["\u200b", "\u00ad", "\U000e0041", "\u2060", "\ufeff", "\u200d", "\u3164"]
ELSEWHERE = ["", "값 1１ ", "a\u200bb ", "ＡＢＣ ", "㎏ ", "❤️ ", "😀 "]


def masked(text: str, secrets: list[str]) -> str:
    result = mask_text(text, secrets=secrets)
    assert mask_known({"v": [text]}, secrets=secrets) == {"v": [result]}
    return result


def test_the_reported_texts_are_masked() -> None:
    disguised = "\u200b".join(SECRET)
    assert masked(f"값: {disguised} 끝", [SECRET]) == "값: *** 끝"
    assert masked(f"값 1１: {disguised}", [SECRET]) == "값 1１: ***"
    assert masked(f"a\u200bb 값: {disguised} 끝", [SECRET]) == "a\u200bb 값: *** 끝"
    assert masked("값: 토큰A\u200bBC123 끝", [MIXED]) == "값: *** 끝"


@pytest.mark.parametrize("elsewhere", ELSEWHERE, ids=ascii)
@pytest.mark.parametrize("hidden", HIDDEN, ids=ascii)
def test_a_korean_secret_with_hidden_characters_is_masked_whatever_else_the_text_holds(
    hidden: str, elsewhere: str
) -> None:
    disguised = hidden.join(SECRET)
    assert masked(f"{elsewhere}값: {disguised} 끝", [SECRET]) == f"{elsewhere}값: *** 끝"
    assert masked(f"{elsewhere}값: 비밀{hidden}정보한글토큰값입니다", [SECRET]) == f"{elsewhere}값: ***입니다"
    assert masked(f"{disguised} {elsewhere}", [SECRET]) == f"*** {elsewhere}"  # at the very start
    assert masked(f"{elsewhere}{disguised}", [SECRET]) == f"{elsewhere}***"  # at the very end


@pytest.mark.parametrize("elsewhere", ELSEWHERE, ids=ascii)
@pytest.mark.parametrize(
    "disguised",
    [
        "토큰A\u200bBC123",
        "토큰ＡＢＣ１２３",  # its ASCII part in full width (Korean has no full-width form)
        "토\u200b큰ＡＢＣ１２３",
        "토큰\u00adＡ\u2060ＢＣ123",
        "토큰\ufeffABC123",
        "토큰ABC\U000e0041123",
    ],
    ids=ascii,
)
def test_a_secret_of_korean_and_ascii_letters_is_masked_disguised(disguised: str, elsewhere: str) -> None:
    assert masked(f"{elsewhere}키는 {disguised} 입니다", [MIXED]) == f"{elsewhere}키는 *** 입니다"
    assert masked(disguised, [MIXED]) == "***"


@pytest.mark.parametrize("elsewhere", ELSEWHERE, ids=ascii)
@pytest.mark.parametrize(
    "split",
    [
        "비밀정보\u200b\n한글토큰값",
        "비밀정보\n\u200b한글토큰값",
        "비밀정보\u00ad\r\n한글토큰값",
        "비밀\u200b정보 \u2060한글토큰값",
    ],
    ids=ascii,
)
def test_a_korean_secret_split_over_lines_with_a_hidden_character_beside_the_break_is_masked(
    split: str, elsewhere: str
) -> None:
    assert masked(f"{elsewhere}값: {split} 끝", [SECRET]) == f"{elsewhere}값: *** 끝"


def test_several_secrets_one_disguised_and_one_plain_are_each_masked() -> None:
    secrets = [SECRET, TOKEN]
    text = f"1１ {ZWSP.join(SECRET)} 그리고 {TOKEN} 끝"
    assert masked(text, secrets) == "1１ *** 그리고 *** 끝"
    text = f"{SECRET} 그리고 {TOKEN[:4]}\u200b{TOKEN[4:]} 끝"
    assert masked(text, secrets) == "*** 그리고 *** 끝"
    text = f"ＡＢＣ {SECRET} 그리고 비밀\u200b정보한글토큰값 또 {TOKEN}"
    assert masked(text, secrets) == "ＡＢＣ *** 그리고 *** 또 ***"
    text = f"{SHY.join(SECRET)} / {ZWSP.join(MIXED)} / {ZWSP.join(TOKEN)}"
    assert masked(text, [SECRET, MIXED, TOKEN]) == "*** / *** / ***"


@pytest.mark.parametrize("elsewhere", ["", "1１ ", "a\u200bb "], ids=ascii)
def test_a_decomposed_korean_secret_is_masked_disguised(elsewhere: str) -> None:
    nfd = unicodedata.normalize("NFD", SECRET)
    assert nfd != SECRET
    assert masked(f"{elsewhere}값: {ZWSP.join(nfd)} 끝", [SECRET]) == f"{elsewhere}값: *** 끝"
    assert masked(f"{elsewhere}값: {nfd[:5]}\u200b{nfd[5:]} 끝", [SECRET]) == f"{elsewhere}값: *** 끝"
    assert masked(f"{elsewhere}값: {ZWSP.join(SECRET)} 끝", [nfd]) == f"{elsewhere}값: *** 끝"  # NFD secret


@pytest.mark.parametrize(
    "text",
    [
        "오늘 회의 1１ 결과\u200b입니다 비밀\u200b정보 토큰\u200b값 a\u200bb",  # the secret's words, not the secret
        "비밀정보\u200b한글 문서의 토큰값 ＡＢＣ 끝",  # (split by whitespace alone it would be the secret)
        "비밀정보한글토큰\u200b가격 ㎏",
        "토큰ＡＢＣ１２ 토큰A\u200bBC12 토큰ABC 4",
        "❤️ 👩\u200d💻 한글\ufeff토큰 😀 ",
    ],
    ids=ascii,
)
def test_ordinary_korean_words_are_kept(text: str) -> None:
    assert masked(text, [SECRET, MIXED]) == text


def test_a_long_korean_text_with_disguises_is_masked_in_bounded_time() -> None:
    """A bound against a blow-up (the whole text is read once at C speed; only where a secret is found is it mapped
    back character by character), not a timing."""
    words = "오늘 회의에서 보안 정책을 검토했습니다 다음 주에 다시 논의하기로 했고 담당자는 결과를 공유할 예정입니다 "
    text = (words * 400)[:20_000]
    text = text[:5_000] + "１２３" + text[5_000:10_000] + "결\u200b과" + text[10_000:]
    disguised = text + "\u200b".join(SECRET)
    started = time.perf_counter()
    for _ in range(10):
        assert mask_text(text, secrets=[SECRET, TOKEN]) == text
        assert mask_text(disguised, secrets=[SECRET, TOKEN]) == text + "***"
    assert time.perf_counter() - started < 5.0
