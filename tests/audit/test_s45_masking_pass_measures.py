"""A key that measures passing (an eval set's ``pass_rate`` threshold) is not a password: masked, an auditor could
not see a deploy gate lowered. A ``pass`` that is a password stays secret."""

from __future__ import annotations

import pytest

from audit.masking import is_secret_key, mask_value


@pytest.mark.parametrize(
    "key", ["pass_rate", "passRate", "PASS_RATE", "min_pass_rate", "pass-count", "pass_ratio", "pass_threshold",
            "pass_percent", "pass_pct", "pass_fail"],
)  # fmt: skip
def test_a_key_that_measures_passing_is_not_secret(key: str) -> None:
    assert not is_secret_key(key)


@pytest.mark.parametrize(
    "key", ["pass", "PASS", "db_pass", "user_pass", "password", "passwd", "pass_phrase", "passphrase", "pw",
            "pass_word", "pass_rate_password",
            # a numeric password (비밀번호) in Korean code, and pw followed by a measure word
            "pw_num", "pw_number", "pass_num", "pass_number", "PASS_NUMBER", "passNumber", "card_pass_number",
            "smtp_pass_num", "pass_total", "pw_rate", "pw_count", "pw_total"],
)  # fmt: skip
def test_a_pass_that_is_a_password_stays_secret(key: str) -> None:
    assert is_secret_key(key)


def test_a_thresholds_pass_rate_is_shown_and_a_password_beside_it_is_not() -> None:
    masked = mask_value({"thresholds": [{"pass_rate": 0.5}], "db_pass": "hunter2-hunter2"})
    assert masked == {"thresholds": [{"pass_rate": 0.5}], "db_pass": "***"}


def test_a_numeric_password_in_a_text_stays_masked() -> None:
    assert mask_value({"pw_num": "4821", "user_pw_number": "s3cr3t!Pw"}) == {"pw_num": "***", "user_pw_number": "***"}
