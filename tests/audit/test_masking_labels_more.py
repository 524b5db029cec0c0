"""Credential labels the masker missed: a Korean or English password label with a qualifier ("비밀번호 확인",
"Password confirmation"), a password cut at "&" ("Tr0ub4dor&3" kept "&3"), one-time codes and PINs ("인증번호",
"OTP", "PIN", "보안 코드", "verification code"; credentials while valid), and a credential given in a sentence
("임시 비밀번호는 Xy12!abc 입니다", "Your verification code is 482913"). Ordinary prose, and what is said about a
code ("인증번호를 입력하세요", "OTP: disabled", "otp_enabled": true), keeps its words (more of those in
test_masking_precision.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from audit.masking import MASK, SecretMaskingFilter, clear_registered_secrets, holds_secret, mask_text, mask_value
from audit.models import AuditEvent
from audit.services import audit_event_record

PASSWORD = "Tr0ub4dor&3"


@pytest.fixture(autouse=True)
def _no_registered_secrets() -> Iterator[None]:
    clear_registered_secrets()
    yield
    clear_registered_secrets()


# --- password labels with a qualifier -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "label",
    [
        "비밀번호 확인",
        "비밀번호 재확인",
        "비밀번호 재입력",
        "새 비밀번호",
        "기존 비밀번호",
        "임시 비밀번호",
        "암호 확인",
        "Password confirmation",
        "password confirm",
        "new password",
    ],
)
def test_a_password_label_with_a_qualifier_hides_the_whole_password(label: str) -> None:
    assert mask_text(f"{label}: {PASSWORD}") == f"{label}: {MASK}"
    assert mask_text(f"{label}={PASSWORD}, 만료: 30일") == f"{label}={MASK}, 만료: 30일"


def test_an_ampersand_ends_a_value_only_before_the_next_parameter() -> None:
    assert mask_text(f"password={PASSWORD}") == f"password={MASK}"
    assert mask_text("password=hunter22&user=kim") == f"password={MASK}&user=kim"
    assert mask_text("password=hunter22&amp;user=kim") == f"password={MASK}&amp;user=kim"


@pytest.mark.parametrize("text", ["토큰 확인: 성공", "전화번호 확인: 010-1234-5678", "비밀번호 확인: "])
def test_a_qualifier_after_another_word_keeps_its_value(text: str) -> None:
    assert mask_text(text) == text


# --- one-time codes and PINs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("인증번호: 482913", f"인증번호: {MASK}"),
        ("인증 번호: 482913", f"인증 번호: {MASK}"),
        ("인증번호: 482913입니다", f"인증번호: {MASK}입니다"),
        ("인증 코드: 7KQ2XA", f"인증 코드: {MASK}"),
        ("OTP: 482913", f"OTP: {MASK}"),
        ("otp=482913", f"otp={MASK}"),
        ("OTP 번호: 482913", f"OTP 번호: {MASK}"),
        ("일회용 비밀번호: 482913", f"일회용 비밀번호: {MASK}"),
        ("PIN: 4821", f"PIN: {MASK}"),
        ("PIN 번호: 4821", f"PIN 번호: {MASK}"),
        ("PIN number: 4821", f"PIN number: {MASK}"),
        ("보안 코드: 482", f"보안 코드: {MASK}"),
        ("보안코드: 482", f"보안코드: {MASK}"),
        ("CVC: 123", f"CVC: {MASK}"),
        ("verification code: 123456", f"verification code: {MASK}"),
        ("Verification Code: G-123456", f"Verification Code: {MASK}"),
        ("one-time code: 482-913", f"one-time code: {MASK}"),
        ("2FA code: 482913", f"2FA code: {MASK}"),
        ("security_code=123", f"security_code={MASK}"),
        ('{"otp": "482913", "verificationCode": 123456}', f'{{"otp": "{MASK}", "verificationCode": {MASK}}}'),
        ("passcode: 123456", f"passcode: {MASK}"),
    ],
)
def test_a_one_time_code_after_its_label_is_masked(text: str, masked: str) -> None:
    assert mask_text(text) == masked


@pytest.mark.parametrize(
    "text",
    [
        "인증번호를 입력하세요",
        "인증번호 6자리를 입력하세요",
        "인증번호는 3분간 유효합니다",
        "인증번호는 180초 후 만료됩니다",
        "OTP: disabled",
        "OTP: 사용 안 함",
        "PIN: 4자리",
        "OTP는 30초마다 바뀝니다",
        "status code: 404",
        "오류 코드: 500",
        "상품 코드: ABC123",
        "주문번호: 20240115",
        "주문 번호 482913",
        "우편번호: 06236",
        '{"pin": 1234, "code": 482913}',  # a lower-case "pin" alone is a word, not the acronym
        "보안 코드 리뷰: 완료",
        "Your code is ready",
        "The error code is 500.",
        "The verification code is valid for 10 minutes.",
        "Order 482913 is your reference",
        # A label and a number with no ":", particle or "is" between: as often a count or a postal code ("OTP 1203
        # users", "PIN 560001") as a code.
        "OTP 482913",
        "PIN 4821",
    ],
)
def test_what_is_said_about_a_code_and_other_numbers_keep_their_words(text: str) -> None:
    assert mask_text(text) == text


def test_a_one_time_code_is_hidden_by_its_key_where_it_has_a_code_s_shape() -> None:
    value = {
        "otp": 482913,
        "PIN": "4821",
        "card_pin": "4821",
        "인증번호": "482913",
        "verification_code": "123456",
        "otp_enabled": True,
        "verification_code_length": 6,
        "OTP": "disabled",
        "pin": 17,
    }
    assert mask_value(value) == {
        "otp": MASK,
        "PIN": MASK,
        "card_pin": MASK,
        "인증번호": MASK,
        "verification_code": MASK,
        "otp_enabled": True,
        "verification_code_length": 6,
        "OTP": "disabled",
        "pin": 17,
    }


def test_a_setting_holding_a_one_time_code_holds_a_secret() -> None:
    assert holds_secret({"otp": "482913"})
    assert not holds_secret({"otp_enabled": True, "otp_digits": 6})


def test_a_log_record_s_extra_one_time_code_is_masked() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "login", None, None)
    record.otp = "482913"
    record.otp_enabled = True
    SecretMaskingFilter().filter(record)
    assert (record.otp, record.otp_enabled) == (MASK, True)


# --- credentials in a sentence ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("임시 비밀번호는 Xy12!abc 입니다", f"임시 비밀번호는 {MASK} 입니다"),
        ("임시 비밀번호는 Xy12!abc입니다.", f"임시 비밀번호는 {MASK}입니다."),
        ("새 비밀번호는 Xy12!abc로 설정되었습니다", f"새 비밀번호는 {MASK}로 설정되었습니다"),
        ("비밀번호를 Xy12!abc로 변경했습니다", f"비밀번호를 {MASK}로 변경했습니다"),
        ("비밀번호는 1234입니다", f"비밀번호는 {MASK}입니다"),
        ("임시 비밀번호는 'admin'입니다", f"임시 비밀번호는 '{MASK}'입니다"),
        ("인증번호는 482913입니다", f"인증번호는 {MASK}입니다"),
        ("인증번호는 482-913 입니다", f"인증번호는 {MASK} 입니다"),
        ("[Web발신] 인증번호 [482913]을 입력해주세요.", f"[Web발신] 인증번호 [{MASK}]을 입력해주세요."),
        ("PIN은 4821입니다", f"PIN은 {MASK}입니다"),
        ("The password is hunter22.", f"The password is {MASK}."),
        ("The Wi-Fi password is 'guest'.", f"The Wi-Fi password is '{MASK}'."),
        ("Your verification code is 482913.", f"Your verification code is {MASK}."),
        ("Your OTP is 482913", f"Your OTP is {MASK}"),
        ("Your PIN is 4821", f"Your PIN is {MASK}"),
        ("G-482913 is your Google verification code.", f"{MASK} is your Google verification code."),
    ],
)
def test_a_credential_given_in_a_sentence_is_masked(text: str, masked: str) -> None:
    assert mask_text(text) == masked


@pytest.mark.parametrize(
    "text",
    [
        "비밀번호는 8자 이상이어야 합니다",
        "비밀번호는 12자 이상, 특수문자를 포함해야 합니다",
        "비밀번호는 bcrypt로 해시됩니다",
        "비밀번호는 SHA-256으로 해시됩니다",
        "비밀번호는 안전하게 보관하세요",
        "비밀번호가 변경되었습니다",
        "주문번호는 20240115입니다",
        "전화번호는 01012345678입니다",
        "The password is incorrect.",
        "The password is required",
        "Your password is case-sensitive.",
        "The password is 8 characters long",
        "It is 2024 now",
        "The word is out.",
    ],
)
def test_prose_about_a_password_keeps_its_words(text: str) -> None:
    assert mask_text(text) == text


# --- the audit record -------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_audit_record_of_a_tool_call_hides_a_one_time_code_and_a_confirmed_password() -> None:
    audit_event_record(
        source="agent",
        tool="send_sms",
        args={"to": "010-1234-5678", "otp": 482913, "otp_enabled": True},
        result={"text": f"인증번호는 482913입니다. 비밀번호 확인: {PASSWORD}"},
    )
    stored = AuditEvent.objects.get(tool="send_sms")
    assert stored.args == {"to": "010-1234-5678", "otp": MASK, "otp_enabled": True}
    assert stored.result == {"text": f"인증번호는 {MASK}입니다. 비밀번호 확인: {MASK}"}
