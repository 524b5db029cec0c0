"""A secret echoed back with every byte percent-encoded (``%72%76%54…``, letters too) was masked nowhere: its hex
and base64 forms were, and ``quote``'s form (which leaves letters readable)."""

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
