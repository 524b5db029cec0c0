"""Secrets in disguises reviews found masked nowhere: every byte percent-encoded (``%72%76%54…``, letters too; its
hex and base64 forms were masked), split by a NUL character, and bound with full-width letters but echoed
half-width."""

from __future__ import annotations

import pytest

from audit.masking import mask_known, mask_text

SECRET = "rvT9xQ2mLp8Z"


@pytest.mark.parametrize("case", [str.upper, str.lower])
def test_a_secret_with_every_byte_percent_encoded_is_masked(case) -> None:
    encoded = case("".join(f"%{b:02x}" for b in SECRET.encode()))
    text = f"요청 주소: https://api.example/v1?token={encoded}&q=1"
    masked = mask_text(text, secrets=[SECRET])
    assert encoded not in masked and "***" in masked and masked.startswith("요청 주소: https://api.example/v1?token=")
    assert encoded not in str(mask_known({"url": text}, secrets=[SECRET]))


def test_a_korean_secret_percent_encoded_byte_by_byte_is_masked() -> None:
    secret = "비밀토큰값한글"
    encoded = "".join(f"%{b:02X}" for b in secret.encode())
    assert encoded not in mask_text(f"echo {encoded} 끝", secrets=[secret])


def test_other_percent_encoded_text_is_left_as_it_is() -> None:
    text = "검색어: %ED%95%9C%EA%B8%80 and %41%42%43"
    assert mask_text(text, secrets=[SECRET]) == text


def test_a_secret_split_by_a_nul_character_is_masked() -> None:
    # The NUL was made U+FFFD (what a database stores) before the secrets were looked for: it split the secret.
    assert mask_text("x tok_ABCD\x00EFGH12 y", secrets=["tok_ABCDEFGH12"]) == "x *** y"
    assert mask_text("x 비밀\x00토큰값한글 y", secrets=["비밀토큰값한글"]) == "x *** y"
    assert mask_text("a\x00b", secrets=["tok_ABCDEFGH12"]) == "a\ufffdb"  # still stored without the NUL


def test_a_secret_bound_with_full_width_letters_is_masked_half_width_and_disguised() -> None:
    secret = "암호Ａ１２３４"
    for echoed in ("암호A1234", "암호Ａ\u200b１２３４", "암호Ａ１２３４"):
        assert mask_text(f"값 {echoed} 끝", secrets=[secret]) == "값 *** 끝"


def test_a_secret_percent_encoded_in_mixed_case_or_in_part_is_masked() -> None:
    raw = SECRET.encode()
    mixed = "".join(f"%{b:02x}" if i % 2 else f"%{b:02X}" for i, b in enumerate(raw))
    partly = "".join(f"%{b:02X}" if i % 2 else chr(b) for i, b in enumerate(raw))
    for encoded in (mixed, partly):
        masked = mask_text(f"요청: https://api.example/v1?token={encoded}&q=1", secrets=[SECRET])
        assert masked == "요청: https://api.example/v1?token=***&q=1"
        assert mask_known({"url": f"?t={encoded}"}, secrets=[SECRET]) == {"url": "?t=***"}
    # Percent-encoded text that holds no secret is left as it is.
    text = "검색: q=%ED%95%9C%EA%B8%80&x=%41%42%43"
    assert mask_text(text, secrets=[SECRET]) == text
