"""Secret names the masker missed or invented: Korean credential labels written as two words ("API 키", "비밀 번호")
or with a full-width colon ("비밀번호："), an exception's class name read as a key ("AuthenticationError: …" hid
the provider's message), and a list of two variable names read as a (name, value) pair (a server's ``public_env``
recorded as ``["API_TOKEN", "***"]``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from audit.masking import MASK, clear_registered_secrets, is_secret_key, mask_text, mask_value
from audit.models import AuditEvent
from audit.services import audit_event_record

SECRET = "Kf83hsQ02LmZwq"


@pytest.fixture(autouse=True)
def _no_registered_secrets() -> Iterator[None]:
    clear_registered_secrets()
    yield
    clear_registered_secrets()


# --- Korean labels ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "label",
    [
        "API키",
        "API 키",
        "api키",
        "액세스키",
        "액세스 키",
        "시크릿 키",
        "비밀 번호",
        "토큰 값",
        "인증 키",
        "인증키",
        "개인 키",
        "개인키",
        "접근 키",
        "접근키",
        "세션 키",
        "암호화 키",
    ],
)
@pytest.mark.parametrize("separator", [": ", "=", " = "])
def test_a_korean_credential_label_hides_its_value_in_text(label: str, separator: str) -> None:
    assert mask_text(f"{label}{separator}{SECRET}") == f"{label}{separator}{MASK}"
    assert (
        mask_text(f"설정 안내 - {label}{separator}{SECRET}, 만료: 30일")
        == f"설정 안내 - {label}{separator}{MASK}, 만료: 30일"
    )


def test_a_korean_credential_label_is_a_secret_key_in_a_mapping() -> None:
    stored = mask_value({"API키": SECRET, "액세스키": "Px9Lq2Wd7Ty4", "접근 키": "Px9Lq2Wd7Ty5", "이름": "김하늘"})
    assert stored == {"API키": MASK, "액세스키": MASK, "접근 키": MASK, "이름": "김하늘"}


def test_a_two_word_label_in_quotes_hides_its_value() -> None:
    assert mask_text(f'{{"API 키": "{SECRET}", "Secret Key": "{SECRET}x"}}') == '{"API 키": "***", "Secret Key": "***"}'


@pytest.mark.parametrize(
    "text",
    [
        "키: 180",  # a height
        "번호: 010-1234-5678",  # a (phone) number
        "토큰 수: 1200",  # a count of tokens
        "토큰 만료: 3600",  # a two-word key only with the label words: not "토큰만료"
        "세션 종료: 10분",
        "암호화: AES-256",  # encryption, not a password
        "값=42",
    ],
)
def test_ordinary_korean_words_before_a_colon_keep_their_value(text: str) -> None:
    assert mask_text(text) == text


def test_only_words_naming_a_credential_are_secret_keys() -> None:
    assert not any(is_secret_key(name) for name in ("키", "번호", "값", "토큰 수", "암호화", "키보드"))


# --- full-width separators ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        (f"비밀번호：{SECRET}", "비밀번호：***"),
        (f"password：{SECRET}", "password：***"),
        (f'"비밀번호"："{SECRET}"', '"비밀번호"："***"'),
        (f"password＝{SECRET}", "password＝***"),
        (f"API 키 ： {SECRET}", "API 키 ： ***"),
    ],
)
def test_a_full_width_colon_or_equals_sign_separates_a_key_from_its_value(text: str, masked: str) -> None:
    assert mask_text(text) == masked


# --- exception class names ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "OpenAIAuthenticationError: Error code: 401 - {'error': 'invalid key'}",
        "openai.AuthenticationError: Incorrect API key provided",
        "botocore.exceptions.NoCredentialsError: Unable to locate credentials",
        "jwt.exceptions.InvalidTokenError: Signature has expired",
        "PasswordResetException: Link expired",
    ],
)
def test_an_exception_class_name_is_not_a_key_naming_a_secret(text: str) -> None:
    assert mask_text(text) == text


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("Authorization: Bearer abcdefgh12345", "Authorization: Bearer ***"),
        ("auth_token: abc123xyz", "auth_token: ***"),
        ("X-Auth: abc123xyz", "X-Auth: ***"),
        ("auth_error: abc123xyz", "auth_error: ***"),  # not an exception's class name: judged as before
        (f"AuthenticationError: rejected api_key={SECRET}", "AuthenticationError: rejected api_key=***"),
    ],
)
def test_secret_keys_that_are_no_class_name_stay_masked(text: str, masked: str) -> None:
    assert mask_text(text) == masked


# --- two names, not a (name, value) pair --------------------------------------------------------------------


def test_a_list_of_two_variable_names_is_not_a_name_value_pair() -> None:
    change = {"public_env": [None, ["API_TOKEN", "DB_PASSWORD"]], "shown": [["API_TOKEN", "LOG_LEVEL"]]}
    assert mask_value(change) == change
    assert mask_value(("API_TOKEN", "AWS_S3_BUCKET")) == ("API_TOKEN", "AWS_S3_BUCKET")
    assert mask_text('{"public_env": [null, ["API_TOKEN", "DB_PASSWORD"]]}') == (
        '{"public_env": [null, ["API_TOKEN", "DB_PASSWORD"]]}'
    )
    assert mask_text("[('API_TOKEN', 'DB_PASSWORD')]") == "[('API_TOKEN', 'DB_PASSWORD')]"


@pytest.mark.parametrize(
    "pair",
    [
        ["X-Api-Key", SECRET],
        ["DB_PASSWORD", "hunter22"],
        ["DB_PASSWORD", "SUMMER_2024"],  # a part that is no word: a password's shape, not a name's
        ["DB_PASSWORD", "ADMIN"],  # no underscore
        ["Authorization", "API_TOKEN_VALUE"],  # a header's name: not a list of variable names
    ],
)
def test_a_real_name_value_pair_is_still_masked(pair: list[str]) -> None:
    assert mask_value([pair]) == [[pair[0], MASK]]
    assert mask_text(f'[["{pair[0]}", "{pair[1]}"]]') == f'[["{pair[0]}", "{MASK}"]]'


@pytest.mark.django_db
def test_the_audit_record_of_a_change_of_shown_settings_names_them() -> None:
    audit_event_record(
        source="admin",
        action="config.mcp_server.update",
        actor="boss",
        args={"public_env": [[], ["API_TOKEN", "DB_PASSWORD"]], "env": {"API_TOKEN": SECRET}},
    )
    stored = AuditEvent.objects.get(action="config.mcp_server.update")
    assert stored.args == {"public_env": [[], ["API_TOKEN", "DB_PASSWORD"]], "env": {"API_TOKEN": MASK}}
