"""What the one-time code, PIN and password-in-a-sentence rules must leave readable: a count, limit, lifetime, time
or id under a code's name (``otp_ttl``, ``mfa_users``, ``otp_sent_at``), a postal PIN code (``pincode``, ``PIN
560001``), a certification or booking number (``KC 인증번호``, ``예약 확인 코드``), a number said about codes
(``OTP 1203 users enrolled``), how a password is kept (``The password is SHA-256 hashed.``, ``암호는 AES-256입니다``: 암호
is also a cipher) and a password check's result (``비밀번호 확인: 일치``). Beside each group, the real credentials that
are still masked. The masker runs on every audit row, run event, tool result, answer and log line: a number hidden
by mistake destroys what an auditor or a user reads, and makes :func:`holds_secret` refuse a setting."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from audit.masking import MASK, SecretMaskingFilter, clear_registered_secrets, holds_secret, mask_text, mask_value


@pytest.fixture(autouse=True)
def _no_registered_secrets() -> Iterator[None]:
    clear_registered_secrets()
    yield
    clear_registered_secrets()


# --- A. keys that name a code -------------------------------------------------------------------------------------

NOT_A_CODE: list[tuple[str, Any]] = [
    ("otp_ttl", 300),
    ("otp_ttl_seconds", 300),
    ("otp_expiry", 180),
    ("verification_code_ttl", 300),
    ("verification_code_expires_in", 180),
    ("pin_lockout_seconds", 900),
    ("PIN_RETRY_LIMIT", 100),
    ("OTP_TIMEOUT", 300),
    ("인증번호_유효시간", 180),
    ("otp_sent_count", 1203),
    ("otp_attempts", 100),
    ("mfa_enrolled_users", 1203),
    ("mfa_users", 120),
    ("2fa_enrolled", 340),
    ("pin_count", 120),
    ("pinCount", 250),
    ("sms_code_sent", 1203),
    ("인증번호 발송건수", 1203),
    ("otp_sent_at", 1715923200),
    ("otp_date", "20240517"),
    ("mfa_device_id", "YK5C12345"),
    ("pin_id", 4821),
    ("map_pin", 1203),
    ("pin_number", 120),
    ("pincode", "560001"),  # a postal code in India
    ("pin_code", "560001"),
    ("shipping_pincode", "560001"),
    ("안전인증번호", "12345"),  # a product safety certification number
    ("KC인증번호", "R-1203"),
    ("예약확인코드", "AB1234"),  # a booking's confirmation code
]
A_CODE: list[tuple[str, Any]] = [
    ("otp", "482913"),
    ("otp", 482913),
    ("verification_code", "482913"),
    ("verificationCode", 482913),
    ("PIN", 4821),
    ("card_pin", "4821"),
    ("인증번호", "482913"),
    ("cvv", "123"),
    ("CVV", 123),
]


@pytest.mark.parametrize(("key", "value"), NOT_A_CODE)
def test_a_count_limit_time_or_id_under_a_code_s_name_stays_in_a_structure(key: str, value: Any) -> None:
    assert mask_value({key: value}) == {key: value}
    assert mask_value({"params": {key: value}}) == {"params": {key: value}}


@pytest.mark.parametrize(("key", "value"), NOT_A_CODE)
def test_a_count_limit_time_or_id_under_a_code_s_name_stays_in_text(key: str, value: Any) -> None:
    for text in (f"{key}: {value}", f"{key}={value}", json.dumps({key: value}, ensure_ascii=False)):
        assert mask_text(text) == text


@pytest.mark.parametrize(("key", "value"), NOT_A_CODE)
def test_a_count_limit_time_or_id_under_a_code_s_name_is_no_secret_in_a_setting_or_a_log(key: str, value: Any) -> None:
    assert not holds_secret({key: value})
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "otp stats", None, None)
    record.__dict__[key] = value
    SecretMaskingFilter().filter(record)
    assert record.__dict__[key] == value


@pytest.mark.parametrize(("key", "value"), A_CODE)
def test_a_code_under_its_own_name_is_still_masked(key: str, value: Any) -> None:
    assert mask_value({key: value}) == {key: MASK}
    assert mask_text(f"{key}: {value}") == f"{key}: {MASK}"
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "login", None, None)
    record.__dict__[key] = value
    SecretMaskingFilter().filter(record)
    assert record.__dict__[key] == MASK


@pytest.mark.parametrize(
    "text", ["otp_ttl: 300", "OTP_TTL_SECONDS=300 MAX_RETRIES=5", "mfa_users=1203 otp_window=300 pin_attempts=100"]
)
def test_settings_and_counters_in_a_log_line_stay(text: str) -> None:
    assert mask_text(text) == text


def test_a_postal_pin_code_or_a_send_time_is_no_secret_in_a_setting() -> None:
    assert not holds_secret({"pincode": "560001"})
    assert not holds_secret({"params": {"pin_code": "560001"}})
    assert not holds_secret({"OTP_SENT_AT": 1715923200})
    assert holds_secret({"otp": "482913"})


def test_a_code_in_a_log_line_of_pairs_is_masked() -> None:
    assert mask_text("otp=482913 user=kim") == f"otp={MASK} user=kim"


# --- B. PIN, OTP, 인증번호 and 보안 코드 with a number in prose -------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "Bengaluru - PIN 560001",
        "PIN: 560001",
        "PIN code: 560001",
        "The PIN code is 560001.",
        "OTP 1203 users enrolled",
        "PIN 1203 attempts blocked",
        "OTP 1203 건",
        "인증번호 1203 건 발송",
        "OTP는 2024 도입",
        "보안 코드 2024 개정",
        "Number of users without a PIN is 120.",
        "Number of users without an OTP is 1203.",
        "KC 인증번호는 HU07123입니다",
        "안전인증번호: 12345",
        "KC 인증번호: R-1203",
        "예약 확인 코드: AB1234",
        "확인 코드: 200",
        "Login code: 200",
        "Auth code: 401",
        "auth code: pending",
        "OTP: 1203 users, SMS: 300 users",
    ],
)
def test_a_number_said_about_codes_or_a_postal_pin_stays(text: str) -> None:
    assert mask_text(text) == text


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("OTP: 482913", f"OTP: {MASK}"),
        ("인증번호: 482913", f"인증번호: {MASK}"),
        ("인증번호는 482913입니다", f"인증번호는 {MASK}입니다"),
        ("Your verification code is 482913", f"Your verification code is {MASK}"),
        (
            "Your verification code is 482913, valid for 3 minutes.",
            f"Your verification code is {MASK}, valid for 3 minutes.",
        ),
        ("PIN: 4821", f"PIN: {MASK}"),
        ("CVV: 123", f"CVV: {MASK}"),
        ("[Web발신] 인증번호 [482913]을 입력해주세요.", f"[Web발신] 인증번호 [{MASK}]을 입력해주세요."),
        ("482913 is your verification code.", f"{MASK} is your verification code."),
    ],
)
def test_a_one_time_code_given_as_one_is_still_masked(text: str, masked: str) -> None:
    assert mask_text(text) == masked


# --- C. a password in a sentence ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "The password is SHA-256 hashed.",
        "The password is PBKDF2-SHA256 hashed with 600000 iterations.",
        "The password is 128-bit.",
        "The password is base64-encoded.",
        "The password is 2FA-protected.",
        "The password is 8-64 characters.",
        "The password is 8-character minimum.",
        "The passcode is 4-digit.",
        "Password is 100% required",
        "Number of users without a password is 1203.",
        "비밀번호는 PBKDF2-SHA256, 반복 횟수 600000회로 저장됩니다",
        "비밀번호는 ISO-27001 기준을 따릅니다",
        "비밀번호는 8-64 자 사이입니다",
        "비밀번호는 2024-05-17 변경",
        "암호는 AES-256입니다",
        "사용하는 암호는 RSA-2048이며 키 길이는 충분합니다",
        "암호는 TLS1.3입니다",
    ],
)
def test_how_a_password_is_kept_stays(text: str) -> None:
    assert mask_text(text) == text


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("임시 비밀번호는 Xy12!abc 입니다", f"임시 비밀번호는 {MASK} 입니다"),
        ("The password is hunter22.", f"The password is {MASK}."),
        ("Your new password is Xy12!abc", f"Your new password is {MASK}"),
        ("password=Tr0ub4dor&3", f"password={MASK}"),
    ],
)
def test_a_password_given_in_a_sentence_or_a_pair_is_still_masked(text: str, masked: str) -> None:
    assert mask_text(text) == masked


# --- D. a password label with a confirmation word ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "비밀번호 확인: 일치",
        "비밀번호 확인: 실패",
        "비밀번호 확인: 불일치",
        "비밀번호 재확인: 완료",
        "Password confirmation: required",
        "Password confirm: mismatch",
        "Password confirmation: does not match",
    ],
)
def test_a_password_check_s_result_stays(text: str) -> None:
    assert mask_text(text) == text


def test_a_password_under_a_confirmation_label_is_still_masked() -> None:
    assert mask_text("비밀번호 확인: Tr0ub4dor&3") == f"비밀번호 확인: {MASK}"
    assert mask_text("Password confirmation: Tr0ub4dor&3") == f"Password confirmation: {MASK}"


# --- cost -----------------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("text", "like"),
    [
        ("it is 1234 " * 20000, "lorem ipsum " * 20000),
        ("OTP " * 80000, "lorem ipsum " * 26667),
        ("인증번호는 " * 40000, "오늘 회의에서 보안 정책을 " * 17143),
        ("비밀번호는 " * 40000, "오늘 회의에서 보안 정책을 " * 17143),
        ("The password is " * 20000, "lorem ipsum " * 26667),
        ("Your OTP is 1203 " * 20000, "lorem ipsum " * 28333),
        ("PIN: " * 40000, "key: " * 40000),  # as costly as any key a pair's key word finds
    ],
)
def test_the_code_and_sentence_rules_stay_cheap_on_adversarial_text(text: str, like: str) -> None:
    def cost(sample: str) -> float:
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            mask_text(sample)
            best = min(best, time.perf_counter() - started)
        return best

    # A bound against a blow-up (quadratic: seconds), not a timing: five times with a 0.1 s floor failed once on a
    # loaded machine (0.153 s against 0.134 s).
    assert cost(text) < max(0.5, 10 * cost(like))
