"""The masking every output goes through: key names, value patterns, known secrets, structures, logging.

Pure Python: no Django, no database.
"""

from __future__ import annotations

import base64
import copy
import io
import json
import logging
import threading
import time
from collections import namedtuple
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, quote_plus

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.masking import (
    MASK,
    SecretMaskingFilter,
    clear_registered_secrets,
    install_logging_filter,
    is_secret_key,
    mask_text,
    mask_value,
    register_secrets,
    registered_secrets,
    truncate,
)

KOREAN = "김하늘 님은 클라우드운영팀 소속입니다"


@pytest.fixture(autouse=True)
def _no_registered_secrets() -> Iterator[None]:
    clear_registered_secrets()
    yield
    clear_registered_secrets()


def encoded_forms(secret: str) -> list[str]:
    """How a secret may travel: raw, base64 (standard and URL-safe, padded or not), URL-encoded."""
    raw = secret.encode("utf-8")
    std = base64.b64encode(raw).decode()
    urlsafe = base64.urlsafe_b64encode(raw).decode()
    return [secret, std, std.rstrip("="), urlsafe, urlsafe.rstrip("="), quote(secret, safe=""), quote_plus(secret)]


# --- key names ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "password",
        "PASSWORD",
        "db_password",
        "passwd",
        "pwd",
        "secret",
        "client_secret",
        "token",
        "access_token",
        "refresh-token",
        "api_key",
        "apikey",
        "apiKey",
        "INTERNAL_API_KEY",
        "X-Api-Key",
        "x.api.key",
        "access_key",
        "aws_secret_access_key",
        "private_key",
        "authorization",
        "Proxy-Authorization",
        "auth",
        "oauth",
        "cookie",
        "Set-Cookie",
        "session",
        "sessionid",
        "SESSION_ID",
        "credential",
        "credentials",
        "serviceKey",
        "servicekey",
        "dbPass",
        "passphrase",
    ],
)
def test_a_secret_key_name_is_recognised(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "max_tokens",
        "prompt_tokens",
        "total_tokens",
        "input_tokens",
        "output_tokens",
        "completion_tokens",
        "token_count",
        "tokenizer",
        "author",
        "authors",
        "coauthor",
        "name",
        "key",
        "primary_key",
        "public_key",
        "sessions",
        "session_timeout",
        "passport",
        "bypass",
        "secretary",
        "",
    ],
)
def test_a_counting_or_naming_key_is_not_secret(key: str) -> None:
    assert not is_secret_key(key)


def test_a_non_string_key_is_not_secret() -> None:
    assert not is_secret_key(42)  # type: ignore[arg-type]
    assert not is_secret_key(None)  # type: ignore[arg-type]


# --- value patterns in text ------------------------------------------------------------------------------------


def test_the_mask_is_three_stars() -> None:
    assert MASK == "***"


@pytest.mark.parametrize("key_id", ["AKIAIOSFODNN7EXAMPLE", "ASIAY34FZKBOKMUTVV7A"])
def test_an_aws_access_key_id_is_masked(key_id: str) -> None:
    assert mask_text(f"using {key_id} now") == "using *** now"


def test_an_aws_like_word_that_is_part_of_a_longer_token_is_left_alone() -> None:
    text = "XAKIAIOSFODNN7EXAMPLE2"
    assert mask_text(text) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "aws_secret_access_key=***",
        ),
        (
            "AWS_SECRET_ACCESS_KEY: wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY done",
            "AWS_SECRET_ACCESS_KEY: *** done",
        ),
        (
            '{"SecretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}',
            '{"SecretAccessKey": "***"}',
        ),
    ],
)
def test_an_aws_secret_access_key_after_its_label_is_masked(text: str, expected: str) -> None:
    assert mask_text(text) == expected


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_a_bearer_token_is_masked_and_the_word_bearer_kept(scheme: str) -> None:
    assert mask_text(f"Authorization: {scheme} abc.DEF-123_xyz~+/=") == f"Authorization: {scheme} ***"
    assert mask_text(f"sent {scheme} abc123 to the server") == f"sent {scheme} *** to the server"


def test_a_basic_credential_is_masked_and_the_word_basic_kept() -> None:
    credential = base64.b64encode(b"admin:hunter22").decode()
    assert mask_text(f"curl -H 'Authorization: Basic {credential}'") == "curl -H 'Authorization: Basic ***'"
    assert mask_text(f"header Basic {credential} sent") == "header Basic *** sent"


def test_prose_that_mentions_bearer_or_basic_is_left_alone() -> None:
    text = "Basic information: send a Bearer token in the header."
    assert mask_text(text) == text


def test_a_jwt_is_masked() -> None:
    jwt = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
    assert mask_text(f"token {jwt} expired") == "token *** expired"


@pytest.mark.parametrize(
    "key",
    [
        "sk-proj-abcdefghijklmnop1234",
        "sk-ant-api03-abcdefghijklmnop",
        "sk_live_51Habcdefghijklmnop",
        "sk_test_abcdefghijkl",
        "xoxb-1234567890-abcdefghijkl",
        "xoxp-1234567890-abcdefghijkl",
        "xoxa-2-1234567890-abcdefghijkl",
        "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    ],
)
def test_an_api_key_with_a_well_known_prefix_is_masked(key: str) -> None:
    assert mask_text(f"use {key} here") == "use *** here"


def test_words_that_merely_contain_an_api_key_prefix_are_left_alone() -> None:
    text = "task-management-system risk_test_scenarios desk-lamp-models"
    assert mask_text(text) == text


def test_a_pem_private_key_block_is_masked() -> None:
    pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7\nq2Xk9z==\n-----END RSA PRIVATE KEY-----"
    masked = mask_text(f"key:\n{pem}\nafter")
    assert masked == "key:\n-----BEGIN RSA PRIVATE KEY-----***-----END RSA PRIVATE KEY-----\nafter"


def test_a_pem_private_key_cut_off_before_its_end_line_is_masked_to_the_end() -> None:
    assert mask_text("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg") == "-----BEGIN PRIVATE KEY-----***"


def test_a_public_key_or_certificate_is_left_alone() -> None:
    text = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----"
    assert mask_text(text) == text


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgres://admin:s3cr3t@db.internal:5432/app", "postgres://admin:***@db.internal:5432/app"),
        ("redis://:p@ss@cache:6379/0", "redis://:***@cache:6379/0"),
        ("https://user:pw@example.com/path?q=1", "https://user:***@example.com/path?q=1"),
    ],
)
def test_the_password_in_a_url_is_masked_and_the_user_kept(url: str, expected: str) -> None:
    assert mask_text(f"connect to {url} now") == f"connect to {expected} now"


def test_a_url_without_credentials_is_left_alone() -> None:
    text = "see https://example.com:8443/docs?page=2&sort=asc#top at 12:30"
    assert mask_text(text) == text


@pytest.mark.parametrize(
    "name",
    ["serviceKey", "api_key", "apikey", "token", "access_token", "key", "secret", "password", "signature", "sig"],
)
def test_a_secret_query_parameter_is_masked(name: str) -> None:
    url = f"https://apis.data.go.kr/1360000/Service?{name}=AbC%2Bdef%3D%3D&numOfRows=10"
    assert mask_text(url) == f"https://apis.data.go.kr/1360000/Service?{name}=***&numOfRows=10"


def test_an_ordinary_query_parameter_is_left_alone() -> None:
    url = "https://example.com/search?q=cloud&page=2&max_tokens=100"
    assert mask_text(url) == url


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("password=hunter22", "password=***"),
        ("db_password = hunter22 next", "db_password = *** next"),
        ("INTERNAL_API_KEY=xyz789abc", "INTERNAL_API_KEY=***"),
        ("X-Api-Key: abc12345", "X-Api-Key: ***"),
        ('{"api_key": "abc123", "name": "kim"}', '{"api_key": "***", "name": "kim"}'),
        ("{'client_secret': 'abc123'}", "{'client_secret': '***'}"),
        ('{\\"password\\": \\"hunter22\\"}', '{\\"password\\": \\"***\\"}'),
        ('{"password": "with \\"quote\\" inside"}', '{"password": "***"}'),
        ("Authorization: Token abc123def", "Authorization: Token ***"),
        ("export GITHUB_TOKEN=abc123def", "export GITHUB_TOKEN=***"),
        ('{"pin": 1234, "secret": 987654}', '{"pin": 1234, "secret": ***}'),
    ],
)
def test_the_value_of_a_secret_key_value_pair_is_masked(text: str, expected: str) -> None:
    assert mask_text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"password": "hunter22', '{"password": "***'),
        ('{\\"password\\": \\"hunter22', '{\\"password\\": \\"***'),
        ("token='abc12345", "token='***"),
    ],
)
def test_the_value_of_a_secret_key_cut_off_before_its_closing_quote_is_masked(text: str, expected: str) -> None:
    assert mask_text(text) == expected


def test_counting_and_naming_pairs_are_left_alone() -> None:
    text = '{"max_tokens": 100, "prompt_tokens": 12, "author": "kim", "token_count": 7}'
    assert mask_text(text) == text


def test_a_pair_inside_the_value_of_a_non_secret_key_is_still_masked() -> None:
    assert mask_text('{"author": "password=hunter22"}') == '{"author": "password=***"}'
    assert mask_text("max_tokens: token=abc12345") == "max_tokens: token=***"


def test_a_cookie_header_is_masked_to_the_end_of_its_line() -> None:
    text = "Cookie: sessionid=abc123; csrftoken=def456\nHost: example.com"
    assert mask_text(text) == "Cookie: ***\nHost: example.com"


def test_null_and_empty_values_of_secret_keys_are_left_alone() -> None:
    text = '{"api_key": null, "token": "", "password": None}'
    assert mask_text(text) == text


def test_korean_text_survives_untouched_around_a_masked_value() -> None:
    assert mask_text(f"{KOREAN} token=abc12345") == f"{KOREAN} token=***"
    assert mask_text(f"{KOREAN} 비밀번호는 hunter22 입니다", secrets=["hunter22"]) == f"{KOREAN} 비밀번호는 *** 입니다"


@pytest.mark.parametrize(
    "text",
    [
        KOREAN,
        "회의는 10:30에 시작합니다. 참석자: 김하늘, 이바다",
        "The author wrote 3 books; see https://example.com/a?b=c",
        "x = 1 + 2; y == 3",
        "",
    ],
)
def test_text_without_secrets_is_returned_unchanged(text: str) -> None:
    assert mask_text(text) == text


def test_masking_is_idempotent() -> None:
    text = "password=hunter22 Bearer abc123def AKIAIOSFODNN7EXAMPLE https://u:p4ss@h/x?token=zz"
    once = mask_text(text, secrets=["hunter22"])
    assert mask_text(once, secrets=["hunter22"]) == once


@pytest.mark.parametrize(
    "text",
    [
        "a" * 200_000,
        "max_tokens=" * 20_000,
        "key:" * 50_000,
        '"password": "' * 15_000,
        "eyJ" * 70_000,
        "://u:p" * 35_000,
        "&a=b" * 50_000,
        "Bearer " * 30_000,
        "-----BEGIN PRIVATE KEY-----" * 8_000,
    ],
    ids=lambda text: text[:12],
)
def test_masking_pathological_text_takes_linear_time(text: str) -> None:
    started = time.perf_counter()
    mask_text(text, secrets=["hunter22"])
    assert time.perf_counter() - started < 3.0  # linear: milliseconds; quadratic: minutes


def test_a_non_string_text_is_converted_before_masking() -> None:
    assert mask_text(12345) == "12345"  # type: ignore[arg-type]


# --- known secret values ----------------------------------------------------------------------------------------


def test_an_exact_secret_is_masked_wherever_it_appears() -> None:
    secret = "Zq8#vL2!pW"
    assert mask_text(f"a{secret}b {secret}", secrets=[secret]) == "a***b ***"


@pytest.mark.parametrize("form", encoded_forms("my-S3cret/Value+1 ok?"), ids=lambda form: form)
def test_an_encoded_form_of_a_secret_is_masked(form: str) -> None:
    assert mask_text(f"x {form} y", secrets=["my-S3cret/Value+1 ok?"]) == "x *** y"


def test_a_secret_shorter_than_four_characters_is_ignored() -> None:
    assert mask_text("a cat sat", secrets=["a", "at", "cat"]) == "a cat sat"


def test_the_longest_secret_is_masked_first() -> None:
    assert mask_text("abcdefgh", secrets=["abcd", "abcdefgh"]) == "***"
    assert mask_text("xx abcdefgh abcd", secrets=["abcdefgh", "abcd"]) == "xx *** ***"


def test_a_single_string_passed_as_secrets_counts_as_one_secret() -> None:
    assert mask_text("the hunter22 value", secrets="hunter22") == "the *** value"


def test_a_mapping_passed_as_secrets_contributes_its_values() -> None:
    env = {"DB_HOST": "db.internal", "DB_PASS": "hunter22"}
    assert mask_text("db.internal hunter22", secrets=env) == "*** ***"  # type: ignore[arg-type]


def test_a_registered_secret_is_masked_by_every_call() -> None:
    register_secrets(["reg-secret-123", "ab"])
    assert registered_secrets() == frozenset({"reg-secret-123"})
    assert mask_text("value reg-secret-123") == "value ***"
    assert mask_value({"note": "reg-secret-123"}) == {"note": "***"}


def test_registering_more_secrets_updates_the_masking() -> None:
    register_secrets(["first-secret"])
    assert mask_text("first-secret second-secret") == "*** second-secret"
    register_secrets(["second-secret"])
    assert mask_text("first-secret second-secret") == "*** ***"
    clear_registered_secrets()
    assert mask_text("first-secret second-secret") == "first-secret second-secret"


def test_registered_and_given_secrets_are_both_masked() -> None:
    register_secrets(["registered-1"])
    assert mask_text("registered-1 given-22", secrets=["given-22"]) == "*** ***"


def test_registering_from_many_threads_keeps_every_secret() -> None:
    def register(batch: int) -> None:
        for index in range(50):
            register_secrets([f"secret-{batch}-{index}"])

    threads = [threading.Thread(target=register, args=(batch,)) for batch in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(registered_secrets()) == 8 * 50


def test_a_registered_secret_with_surrounding_whitespace_is_also_known_stripped() -> None:
    register_secrets(["  padded-secret\n"])
    assert mask_text("x padded-secret y") == "x *** y"


# --- structures ------------------------------------------------------------------------------------------------


def test_values_under_secret_keys_become_the_mask_whatever_their_type() -> None:
    value = {"password": 12345678, "token": {"a": 1}, "api_key": ["x"], "secret": True, "name": "kim"}
    assert mask_value(value) == {"password": MASK, "token": MASK, "api_key": MASK, "secret": MASK, "name": "kim"}


def test_none_and_empty_values_under_secret_keys_are_kept() -> None:
    value = {"password": None, "token": "", "credentials": [], "secret": {}}
    assert mask_value(value) == value


def test_nested_structures_are_masked_throughout() -> None:
    value = {
        "rows": [
            {"id": 1, "note": f"{KOREAN} token=abc12345", "auth": {"user": "kim"}},
            ("hunter22", 2.5, None, {"deep": ["Bearer abc123def"]}),
        ],
        "max_tokens": 100,
    }
    assert mask_value(value, secrets=["hunter22"]) == {
        "rows": [
            {"id": 1, "note": f"{KOREAN} token=***", "auth": MASK},
            ("***", 2.5, None, {"deep": ["Bearer ***"]}),
        ],
        "max_tokens": 100,
    }


def test_dict_keys_are_masked_as_text() -> None:
    assert mask_value({"hunter22": 1, "plain": 2}, secrets=["hunter22"]) == {"***": 1, "plain": 2}


def test_two_keys_masked_to_the_same_text_are_both_kept() -> None:
    masked = mask_value({"hunter22": 1, "hunter33": 2}, secrets=["hunter22", "hunter33"])
    assert sorted(masked.values()) == [1, 2]
    assert "***" in masked
    assert all("hunter" not in key for key in masked)


def test_scalars_are_returned_unchanged() -> None:
    for scalar in (0, 7, -1.5, True, False, None):
        assert mask_value(scalar) is scalar


def test_the_input_is_never_mutated() -> None:
    value = {"password": "hunter22", "rows": [{"token": "abc"}, ["Bearer abc123def"]], "t": ("sk-abcdefghijklmnop",)}
    before = copy.deepcopy(value)
    masked = mask_value(value)
    assert value == before
    assert masked is not value
    assert masked["rows"] is not value["rows"]


def test_two_hundred_levels_of_nesting_are_handled() -> None:
    value: Any = "token=abc12345"
    for depth in range(200):
        value = {"level": [value]} if depth % 2 else [value]
    masked = mask_value(value)
    for depth in reversed(range(200)):
        masked = masked["level"][0] if depth % 2 else masked[0]
    assert masked == "token=***"


def test_nesting_far_beyond_the_recursion_limit_is_handled() -> None:
    value: Any = "hunter22"
    for _ in range(20_000):
        value = [value]
    masked = mask_value(value, secrets=["hunter22"])
    for _ in range(20_000):
        masked = masked[0]
    assert masked == "***"


def test_a_reference_cycle_is_cut() -> None:
    value: list[Any] = ["hunter22"]
    value.append(value)
    assert mask_value(value, secrets=["hunter22"]) == ["***", "<cycle>"]


def test_tuples_sets_and_named_tuples_keep_their_kind() -> None:
    pair = namedtuple("pair", "left right")
    masked = mask_value({"t": ("hunter22", 1), "s": {"hunter22", "ok"}, "n": pair("hunter22", 2)}, secrets=["hunter22"])
    assert masked == {"t": ("***", 1), "s": {"***", "ok"}, "n": pair("***", 2)}
    assert type(masked["n"]) is pair


def test_bytes_are_masked_as_text() -> None:
    assert mask_value(b"password=hunter22") == b"password=***"


def test_an_unknown_object_is_replaced_by_its_masked_text() -> None:
    class Connection:
        def __str__(self) -> str:
            return "Connection(password=hunter22)"

    assert mask_value({"conn": Connection()}) == {"conn": "Connection(password=***)"}


def test_a_pydantic_model_is_masked_as_its_dump() -> None:
    pydantic = pytest.importorskip("pydantic")

    class TextContent(pydantic.BaseModel):
        type: str
        text: str

    assert mask_value([TextContent(type="text", text="token=abc12345")]) == [{"type": "text", "text": "token=***"}]


# --- truncate --------------------------------------------------------------------------------------------------


def test_a_small_value_is_returned_unchanged_by_truncate() -> None:
    value = {"rows": [1, 2, 3]}
    assert truncate(value, max_chars=100) is value


def test_a_large_value_is_replaced_by_a_preview() -> None:
    value = {"rows": list(range(1000))}
    text = json.dumps(value, ensure_ascii=False)
    assert truncate(value, max_chars=50) == {"truncated": True, "original_chars": len(text), "preview": text[:50]}


def test_truncate_counts_characters_not_bytes() -> None:
    value = "가" * 10  # 12 JSON characters, 32 UTF-8 bytes
    assert truncate(value, max_chars=12) == value
    assert truncate(value, max_chars=11) == {"truncated": True, "original_chars": 12, "preview": '"' + "가" * 10}


def test_truncate_serialises_unknown_objects_with_str() -> None:
    class Thing:
        def __str__(self) -> str:
            return "x" * 100

    assert truncate([Thing()], max_chars=20)["original_chars"] == len(json.dumps(["x" * 100]))


def test_truncate_has_a_default_of_twenty_thousand_characters() -> None:
    assert truncate("a" * 19_990) == "a" * 19_990
    assert truncate("a" * 20_000)["truncated"] is True


# --- logging ---------------------------------------------------------------------------------------------------


@pytest.fixture
def captured_logger() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handler.addFilter(SecretMaskingFilter())
    logger = logging.getLogger("tests.audit.masking")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(handler)
    yield logger, stream
    logger.removeHandler(handler)


def test_the_logging_filter_masks_message_arguments(captured_logger: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured_logger
    logger.info("calling %s with %s", "https://api.example.com?serviceKey=abc123", "password=hunter22")
    assert stream.getvalue() == "INFO calling https://api.example.com?serviceKey=*** with password=***\n"


def test_the_logging_filter_masks_exception_tracebacks(captured_logger: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured_logger
    register_secrets(["registered-secret-1"])
    try:
        raise RuntimeError("connect failed: token=abc12345 key registered-secret-1")
    except RuntimeError:
        logger.exception("tool %s failed", "Bearer abc123def")
    output = stream.getvalue()
    assert "Traceback" in output
    assert "RuntimeError: connect failed: token=*** key ***" in output
    assert "Bearer ***" in output
    assert "abc12345" not in output
    assert "registered-secret-1" not in output
    assert "abc123def" not in output


def test_the_logging_filter_masks_registered_secrets(captured_logger: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured_logger
    register_secrets(["reg-value-99"])
    logger.warning("value is reg-value-99 (%d)", 3)
    assert stream.getvalue() == "WARNING value is *** (3)\n"


def test_the_logging_filter_always_lets_the_record_through() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "token=%s", ("abc12345",), None)
    assert SecretMaskingFilter().filter(record) is True
    assert record.msg == "token=***"
    assert record.args is None
    assert record.getMessage() == "token=***"


def test_the_logging_filter_masks_extra_attributes() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "done", (), None)
    record.api_key = "abc12345"
    record.detail = {"password": "hunter22", "ok": 1}
    SecretMaskingFilter().filter(record)
    assert record.api_key == MASK
    assert record.detail == {"password": MASK, "ok": 1}


def test_a_broken_format_string_is_logged_masked_rather_than_raising() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "token=%s %s", ("abc12345",), None)
    SecretMaskingFilter().filter(record)
    assert record.getMessage() == "token=*** %s"


@pytest.fixture
def restore_handler_filters() -> Iterator[None]:
    handlers = {
        handler
        for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
        if isinstance(logger, logging.Logger)
        for handler in logger.handlers
    }
    before = {handler: list(handler.filters) for handler in handlers}
    yield
    for handler, filters in before.items():
        handler.filters[:] = filters


@pytest.mark.usefixtures("restore_handler_filters")
def test_install_logging_filter_covers_every_handler_once() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    library_logger = logging.getLogger("tests.audit.masking.library")
    library_logger.propagate = False
    library_logger.addHandler(handler)

    def maskers(target: logging.Handler) -> int:
        return sum(isinstance(f, SecretMaskingFilter) for f in target.filters)

    roots = logging.getLogger().handlers
    before = {root_handler: maskers(root_handler) for root_handler in roots}
    try:
        install_logging_filter()
        install_logging_filter()
        assert maskers(handler) == 1
        for root_handler in roots:  # one added where there was none; none added where one was already
            assert maskers(root_handler) == max(1, before[root_handler])
        library_logger.error("password=%s", "hunter22")
        assert stream.getvalue() == "password=***\n"
    finally:
        library_logger.removeHandler(handler)


# --- properties ------------------------------------------------------------------------------------------------

ascii_secrets = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=8, max_size=40)
unicode_secrets = st.text(
    st.characters(categories=("L", "N", "P", "S", "Zs"), exclude_characters="\x00"), min_size=8, max_size=40
)
secrets = ascii_secrets | unicode_secrets
surrounding_text = st.text(max_size=80)
property_settings = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_not_leaked(secret: str, output: str) -> None:
    for form in encoded_forms(secret):
        assert form not in output, f"{form!r} survived in {output!r}"


@pytest.mark.slow  # ≥ 1.5 s: the fast loop stays under five minutes
@property_settings
@given(secret=secrets, before=surrounding_text, after=surrounding_text, data=st.data())
def test_a_given_secret_never_survives_mask_text_in_any_form(
    secret: str, before: str, after: str, data: st.DataObject
) -> None:
    form = data.draw(st.sampled_from(encoded_forms(secret)))
    output = mask_text(before + form + after, secrets=[secret])
    assert_not_leaked(secret, output)


@pytest.mark.slow  # ≥ 1.5 s: the fast loop stays under five minutes
@property_settings
@given(secret=secrets, before=surrounding_text, after=surrounding_text, data=st.data())
def test_a_registered_secret_never_survives_mask_text_in_any_form(
    secret: str, before: str, after: str, data: st.DataObject
) -> None:
    clear_registered_secrets()
    register_secrets([secret])
    form = data.draw(st.sampled_from(encoded_forms(secret)))
    assert_not_leaked(secret, mask_text(f"{before}{form}{after}"))


# Finite floats: a NaN or an infinity becomes its text (test_a_float_no_json_column_stores_becomes_its_text).
json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)


def strings_in(value: Any) -> Iterator[str]:
    """Every string in a JSON-like structure: keys and values."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for key, child in item.items():
                yield str(key)
                stack.append(child)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


@st.composite
def json_with_a_secret(draw: st.DrawFn, secret: str) -> Any:
    """A random JSON value with ``secret`` (or one of its forms) spliced into random strings and keys."""
    form = draw(st.sampled_from(encoded_forms(secret)))
    embed = st.builds(lambda a, b: f"{a}{form}{b}", st.text(max_size=10), st.text(max_size=10))
    with_secret = st.recursive(
        embed | json_scalars,
        lambda children: (
            st.lists(children, min_size=1, max_size=4)
            | st.dictionaries(embed | st.text(max_size=10), children, min_size=1, max_size=4)
        ),
        max_leaves=20,
    )
    return draw(st.lists(with_secret, min_size=1, max_size=3).map(lambda items: [form, *items]))


@pytest.mark.slow
@property_settings
@given(data=st.data(), secret=secrets)
def test_a_given_secret_never_survives_mask_value_in_any_form(data: st.DataObject, secret: str) -> None:
    value = data.draw(json_with_a_secret(secret))
    before = copy.deepcopy(value)
    masked = mask_value(value, secrets=[secret])
    assert value == before
    for text in strings_in(masked):
        assert_not_leaked(secret, text)
    assert_not_leaked(secret, mask_text(json.dumps(value, ensure_ascii=False), secrets=[secret]))


@pytest.mark.slow
@property_settings
@given(value=json_values)
def test_mask_value_never_mutates_and_keeps_the_shape(value: Any) -> None:
    before = copy.deepcopy(value)
    masked = mask_value(value)
    assert value == before
    assert type(masked) is type(value)
    if isinstance(value, (list, dict)):
        assert len(masked) == len(value)


@pytest.mark.slow
@property_settings
@given(text=st.text(alphabet=st.characters(min_codepoint=0xAC00, max_codepoint=0xD7A3) | st.sampled_from(" .,?!")))
def test_korean_text_is_never_changed(text: str) -> None:
    assert mask_text(text) == text


@pytest.mark.slow
@property_settings
@given(text=st.text())
def test_mask_text_accepts_any_text(text: str) -> None:
    assert isinstance(mask_text(text, secrets=["hunter22"]), str)


def test_what_a_text_masks_to_is_remembered_per_set_of_secrets_never_across_sets() -> None:
    """Short texts and keys are remembered across calls (a run masks the same names many times), per matcher:
    a secret registered since, or given to one call, is masked at once; a text seen before without it is not
    answered from memory."""
    value = {"note": "토큰 tok-5f3a9c1e2d", "api_key": "x", "team": "클라우드운영팀"}
    assert mask_value(value) == {"note": "토큰 tok-5f3a9c1e2d", "api_key": MASK, "team": "클라우드운영팀"}
    assert mask_value(value, secrets=["tok-5f3a9c1e2d"])["note"] == f"토큰 {MASK}"
    assert mask_value(value)["note"] == "토큰 tok-5f3a9c1e2d"  # that call's secret is not everyone's
    register_secrets(["tok-5f3a9c1e2d"])
    assert mask_value(value)["note"] == f"토큰 {MASK}"
    assert mask_text("토큰 tok-5f3a9c1e2d") == f"토큰 {MASK}"
    clear_registered_secrets()
    assert mask_value(value)["note"] == "토큰 tok-5f3a9c1e2d"


def test_the_remembered_texts_are_bounded() -> None:
    from audit import masking

    for batch in range(3):
        mask_value([f"텍스트 {batch}-{i}" for i in range(masking._MEMO_MAX_ENTRIES)])
    assert len(masking._NO_SECRET_MEMOS.texts) <= 2 * masking._MEMO_MAX_ENTRIES


def test_a_float_no_json_column_stores_becomes_its_text() -> None:
    masked = mask_value({"ratio": float("nan"), "limit": [float("inf"), -float("inf")], "ok": 1.5})
    assert masked == {"ratio": "nan", "limit": ["inf", "-inf"], "ok": 1.5}
    json.dumps(masked, allow_nan=False)  # storable as JSON


@pytest.mark.parametrize("before", [b"", b"Bearer ", b"user:", b"x:", b"ab"])
def test_a_secret_base64_encoded_inside_a_longer_value_is_masked_at_any_offset(before: bytes) -> None:
    secret = "Qm7vT2pLx9RkW4zN8cYb"
    encoded = base64.b64encode(before + secret.encode()).decode()
    masked = mask_text(f"header={encoded}", secrets=[secret])
    assert "***" in masked
    assert base64.b64decode(encoded) != base64.b64decode(masked.split("=", 1)[1].replace("***", "") + "==")
    # what is left of the encoded text holds at most a character or two of the secret's bits on either side
    assert len(masked.split("=", 1)[1].replace("***", "").rstrip("=")) <= len(base64.b64encode(before)) + 2


def test_a_long_secret_in_other_letter_case_is_masked() -> None:
    secret = "Qm7vT2pLx9RkW4zN8cYb"
    assert mask_text(f"TOKEN USED: {secret.upper()}; {secret.lower()}", secrets=[secret]) == "TOKEN USED: ***; ***"


def test_this_platforms_api_keys_are_masked_and_the_prefix_that_names_one_is_kept() -> None:
    key = "apk_ZqJ3w9HkT2uVb7XcLm4NpR8sYd1eFg6A-x_12345678"  # apk_ and token_urlsafe(32): 43 characters
    assert mask_text("Use apk_analyzer_get_permissions on apk_release_build_2024_signed.zip") == (
        "Use apk_analyzer_get_permissions on apk_release_build_2024_signed.zip"  # identifiers, not keys
    )
    assert mask_text(f"내 키 {key} 입니다") == "내 키 *** 입니다"
    assert mask_value({"note": key}) == {"note": "***"}
    assert mask_text("키 apk_ZqJ3w9Hk 폐기") == "키 apk_ZqJ3w9Hk 폐기"


def test_the_value_after_a_command_line_option_naming_a_secret_is_masked() -> None:
    args = ["-m", "server", "--api-key", "Xq81LmZp0aT7", "--port", "8080", "--max-tokens", "500", "--verbose"]
    assert mask_value({"args": args}) == {
        "args": ["-m", "server", "--api-key", "***", "--port", "8080", "--max-tokens", "500", "--verbose"]
    }
    assert mask_value({"args": ["--password", "--verbose"]}) == {"args": ["--password", "--verbose"]}  # an option
    unmasked = ["--no-password", "deploy", "--password-stdin", "docker", "--token-file", "/run/token"]
    assert mask_value({"args": unmasked}) == {"args": unmasked}  # options that take no secret after them


def test_a_list_that_is_no_command_line_keeps_its_items_after_a_dash() -> None:
    bullets = ["- password reset steps", "Open settings", "- Token", "is a noun", "--api-key", "what it is"]
    assert mask_value({"steps": bullets}) == {"steps": bullets}
    assert mask_value(bullets) == bullets


def test_celerys_own_task_logger_masks_secrets_too(tmp_path: Any) -> None:
    from celery.utils.log import get_task_logger

    from agent_platform.celery import app

    secret = "celery-task-secret-7Hq2Lm9"
    register_secrets([secret])
    logfile = tmp_path / "worker.log"
    task_logger = app.log.setup_task_loggers(loglevel=logging.INFO, logfile=str(logfile))  # as a worker starts
    try:
        get_task_logger("agents.tasks").info("calling the backend with %s", secret)
        for handler in task_logger.handlers:
            handler.flush()
        written = logfile.read_text(encoding="utf-8")
        assert "calling the backend with ***" in written and secret not in written
    finally:
        for handler in list(task_logger.handlers):
            task_logger.removeHandler(handler)
            handler.close()


def test_a_changes_old_and_new_command_lines_are_masked_too() -> None:
    diff = {"args": [["-m", "server"], ["-m", "server", "--api-key", "Xq81LmZp0aT7"]]}  # a binding's args changed
    assert mask_value(diff) == {"args": [["-m", "server"], ["-m", "server", "--api-key", "***"]]}


def test_the_credential_of_an_authorization_value_is_masked_on_its_own() -> None:
    """A header is stored (and registered) whole, ``Bearer <token>``; a server that quotes the token without its
    scheme ("token X is not authorised") used to show it in clear."""
    assert mask_text(
        "upstream refused: token tok9f8e7d6c5b4a3e2d1 is not authorised", secrets=["Bearer tok9f8e7d6c5b4a3e2d1"]
    ) == ("upstream refused: token *** is not authorised")
    basic = base64.b64encode(b"kim:pa55-w0rd!").decode()
    assert (
        mask_text(f"password pa55-w0rd! refused ({basic})", secrets=[f"Basic {basic}"]) == "password *** refused (***)"
    )
    assert mask_text("auth failed for s3cret-pw", secrets=["postgres://app:s3cret-pw@db:5432/app"]) == (
        "auth failed for ***"
    )
    assert mask_text("Bearer tokens expire", secrets=["Bearer abc"]) == "Bearer tokens expire"  # too short alone
    # A part that could be an ordinary word or number is masked only within the whole value: a weak password
    # masked alone would mask the word (or every year) everywhere.
    assert mask_text("auth failed for postgres", secrets=["postgres://postgres:postgres@db/app"]) == (
        "auth failed for postgres"
    )
    admin_pair = base64.b64encode(b"admin:admin").decode()
    assert mask_text("admin logged in", secrets=[f"Basic {admin_pair}"]) == "admin logged in"
    assert mask_value({"year": 2024}, secrets=[f"Basic {base64.b64encode(b'user:2024').decode()}"]) == {"year": 2024}


def test_a_secret_made_of_digits_is_masked_where_it_comes_back_as_a_json_number() -> None:
    secrets = ["84719305"]
    result = {"service": "vault", "unlocked_with": 84719305, "again": [84719305, 84719305.0], "count": 3, "ok": True}
    assert mask_value(result, secrets=secrets) == {
        "service": "vault",
        "unlocked_with": MASK,
        "again": [MASK, MASK],
        "count": 3,
        "ok": True,
    }
    assert mask_value(84719305, secrets=secrets) == MASK
    assert mask_value({"n": 84719306}, secrets=secrets) == {"n": 84719306}


def test_korean_names_of_secrets_are_secret_keys_in_structures_and_in_text() -> None:
    """The people this is built for name their fields in Korean: 비밀번호 (password), 암호 (password), 토큰
    (token), 인증키 (auth key). The same value was masked under ``password`` and shown under ``비밀번호``."""
    stored = mask_value({"아이디": "kim", "비밀번호": "Zx9vQ2mL7pR4tY8w", "인증키": "k-77aa", "토큰": "t-9"})
    assert stored == {"아이디": "kim", "비밀번호": MASK, "인증키": MASK, "토큰": MASK}
    assert (
        mask_text("아이디: kim / 비밀번호: Zx9vQ2mL7pR4tY8w / 암호=hunter22")
        == "아이디: kim / 비밀번호: *** / 암호=***"
    )
    # Counting and naming keys are not secret: an encryption scheme, a token count.
    assert mask_text("토큰화: 형태소 분석") == "토큰화: 형태소 분석"  # tokenization, as "tokenizer"
    assert mask_value({"암호화_방식": "AES-256", "토큰_수": 12, "토큰사용량": 30}) == {
        "암호화_방식": "AES-256",
        "토큰_수": 12,
        "토큰사용량": 30,
    }
    assert mask_text(KOREAN + ": 팀장") == KOREAN + ": 팀장"
