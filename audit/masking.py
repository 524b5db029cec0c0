"""The one place secrets are masked: every audit row, log line, API response, admin page, exception message
and final answer goes through this module before it leaves the process.

Pure Python (no Django), safe to import anywhere, thread-safe.

What is masked, and how:

* **Known secret values** - the ``secrets`` passed to a call plus every value given to
  :func:`register_secrets` or :func:`register_process_secrets` (the process's own keys and passwords) - wherever
  they appear, together with their base64 (standard and URL-safe, with and without padding), URL-encoded
  (``quote`` / ``quote_plus``), JSON-escaped (``/`` as ``\\/`` too) and HTML-escaped (``/`` as ``&#x2F;`` or
  ``&#47;`` too) forms, each in both Unicode normalization forms (a Korean value bound composed, NFC, is masked where
  a server writes it decomposed, NFD, and the reverse); and for values of
  :data:`MIN_ENCODED_SECRET_LENGTH` characters or more also their hex (either case), base32 (either case, with
  and without padding) and reversed forms, and the value and its base64, hex and base32 forms with whitespace
  between any of their characters (``s k - 1 2 3 …``, a value split over lines, base64 wrapped at 76 columns by
  ``base64.encodebytes`` or PEM-style, ``xxd``'s ``6372 6d54 …``). Values shorter than :data:`MIN_SECRET_LENGTH`
  characters are ignored: masking ``"a"`` everywhere would destroy the text.
* **Value patterns** - AWS access key ids, labelled AWS secret access keys, ``Bearer``/``Basic``
  credentials, JWTs, well-known API key formats (``sk-...``, ``sk_live_...``, ``xoxb-...``, ``ghp_...``, ...,
  and this platform's own ``apk_...``), PEM private key blocks, passwords in URLs, secret-looking query parameters.
* **Key names** - ``key=value``, ``key: value`` and ``"key": "value"`` pairs in text (a full-width ``：`` or ``＝``
  too; a key may be a two-word label as Korean writes it, ``API 키``, ``비밀 번호``, or a password's label with the
  word that asks for it again, ``비밀번호 확인``, ``Password confirmation``, where the value reads as a password:
  ``비밀번호 확인: 일치`` stays), and dict entries in structures, whose key :func:`is_secret_key` recognises
  (NFKC-normalised: a full-width key counts).
* **One-time codes** - a verification code, OTP, PIN or card security code under a name whose last word is the
  code (``otp``, ``verification_code``, ``card_pin``, ``PIN``, ``인증번호``, ``보안 코드``, ``cvv``; not ``otp_ttl``,
  ``mfa_users``, ``otp_sent_at``, ``pin_count``, a postal ``pincode``/``PIN code``, ``KC 인증번호``, ``확인 코드``),
  where the value has that code's shape: 4 to 8 digits (``482-913``, ``G-482913``, ``7KQ2XA`` too) for a one-time
  code, 4 digits for a PIN (``PIN: 560001`` is a postal code), 3 or 4 for a card's, and no word after it
  (``OTP: 1203 users``). ``"otp_enabled": true`` and ``OTP: disabled`` stay.
* **Credentials in a sentence** - a code label, a particle and the code (``인증번호는 482913입니다``, ``인증번호
  [482913]을``; not ``OTP 1203 건``, ``OTP는 2024 도입``), a password label (not ``암호``, also a cipher), a particle
  and a password that ends the sentence or meets a copula (``임시 비밀번호는 Xy12!abc 입니다``), and in English
  ``Your/The … password is Xy12!abc.``, ``Your verification code is 482913``, ``482913 is your verification code``.
  A password there must not read as a word or as words and numbers joined by ``-`` (``bcrypt``, ``SHA-256``,
  ``128-bit``) unless quoted.
* **Names apart from their values** - ``{"name": "Authorization", "value": …}`` entries (HAR, OpenAPI, Postman,
  Kubernetes env, AWS tags: a ``name``/``key``/``header``/``field``… field naming a secret masks its
  ``value``/``val``/``content``/``secret`` field), ``("X-Api-Key", …)`` pairs (a tuple, or a 2-item list in a
  list: header lists), and in text their JSON/repr forms, URL-encoded pairs (``password%3D…``), XML elements
  (``<password>…</password>``) and command-line forms (``--password …``, ``mysql -p…``, ``sshpass -p …``).

Masking replaces the secret with :data:`MASK` and keeps everything around it, so text (any language) stays
readable. It is best effort for patterns and exact for known values: a secret the platform knows about
(binding env/header values) must be passed in ``secrets`` or registered, never left to the patterns.

Masked text is also text every database stores: a NUL character (PostgreSQL refuses it in text and JSON) and
an unpaired surrogate (``"\\ud800"`` in a tool's JSON: no UTF-8 encoder takes it) become U+FFFD, and a float NaN
or infinity (no JSON column takes it) becomes its text (``"nan"``, ``"inf"``). What a tool or
a model returns is masked before it is stored or shown, so neither can make an audit row or a run unstorable.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime as _dt
import decimal
import enum
import functools
import html
import ipaddress
import json
import logging
import math
import re
import threading
import unicodedata
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal
from urllib.parse import quote, quote_plus, unquote, urlsplit

from audit.visible import hidden_ranges, merged_ranges

__all__ = [
    "MASK",
    "MIN_ENCODED_SECRET_LENGTH",
    "MIN_SECRET_LENGTH",
    "SecretMaskingFilter",
    "clear_registered_secrets",
    "holds_secret",
    "install_logging_filter",
    "is_secret_key",
    "mask_internal_locations",
    "mask_text",
    "mask_value",
    "register_process_secrets",
    "register_secrets",
    "registered_secrets",
    "truncate",
]

MASK: str = "***"
"""What replaces a secret."""

MIN_SECRET_LENGTH = 4
"""Known secret values shorter than this are ignored (they would match everywhere)."""

MIN_ENCODED_SECRET_LENGTH = 8
"""Known secret values this long or longer are also masked in their hex, base32, reversed and whitespace-split
forms (a shorter value's such forms would match ordinary text)."""


# --- key names ------------------------------------------------------------------------------------------

_KEY_SEPARATORS = re.compile(r"[\s_.\-]+")
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")

# Matched against the lower-cased key with separators removed ("X-Api-Key" -> "xapikey").
_SECRET_KEY_FRAGMENTS = re.compile(
    r"""
      passw | passphrase | passcode | pwd
    | secret(?!ar)                                  # not "secretary"
    | apikey | accesskey | privatekey | servicekey | accountkey
    | (?:signing|encryption|decryption|master|ssh|hmac|app|license)key
    | (?:subscription|functions?|integration|storage|shared)key  # Ocp-Apim-Subscription-Key, x-functions-key
    | credential | cookie
    | (?<!pos)session(?:id|key|data)?$              # "session", "sessionid"; not "sessions", "session_timeout"
    | token(?!s|count|limit|usage|iz|is|type|budget)  # not "max_tokens", "token_count", "tokenizer"
    | (?:access|refresh|bearer|api|session|csrf)tokens  # ... but a list of access tokens is secret
    | auth(?!or(?!i[sz](?!ed$)))                    # "auth", "oauth", "authorization"; not "author(s)", nor
                                                    # a name that ends "(un)authorized" (Django's "Unauthorized: /path"
                                                    # keeps its path); "authorized_code", "pre-authorized_code" do
    | 비밀번호 | 비번 | 패스워드 | 시크릿 | 인증키 | 인증토큰 | 개인키 | 비밀키
    | (?:api|액세스|접근|세션|암호화|서명|마스터)키  # "API 키", "액세스 키": a key that is a credential;
                                                    # not "키" alone (a height, a keyboard key)
    | 암호(?!화)                                     # "암호" (password); not "암호화" (encryption)
    | 토큰(?!수|개수|사용|한도|량|예산|화)                # "토큰"; not "토큰 수" (a count), "토큰 사용량", "토큰화"
    """,
    re.VERBOSE,
)
# Whole words of the key (split on separators and camelCase) that are secret on their own.
_SECRET_KEY_WORDS = frozenset({"pass", "pw"})
# Words that, following ``pass`` (never ``pw``), make the key a measure of passing, not a password: an eval set's
# ``pass_rate`` threshold (masked, an auditor could not see a deploy gate lowered), ``pass_count``, ``pass_fail``.
# Not ``num``/``number``/``total``: ``pass_number``, ``pw_num`` name a numeric password (비밀번호) in Korean code.
_PASS_MEASURE_WORDS = frozenset(
    {"rate", "rates", "count", "counts", "ratio", "threshold", "thresholds", "percent", "percentage", "pct", "fail",
     "fails", "score"}
)  # fmt: skip
# An exception's class name, perhaps with its module ("openai.AuthenticationError", "NoCredentialsError"): in a
# traceback line "OpenAIAuthenticationError: Error code: 401" it is followed by ":" like a key, but what follows is
# its message, not a credential. Only the CamelCase class shape: "auth_error", "X-Auth" stay secret names.
_EXCEPTION_CLASS_NAME = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_]*\.)*[A-Z][A-Za-z0-9]*(?:Error|Exception)")
_CACHED_KEY_CHARS = 256


def is_secret_key(key: str) -> bool:
    """Whether a dict key / header / parameter / variable name names a secret.

    NFKC-normalised first (a full-width ``ｐａｓｓｗｏｒｄ`` is ``password``); case-insensitive; separators ``-``,
    ``_``, ``.`` and spaces are ignored, then the name is searched for secret words (password, secret, token,
    api key, access key, private key, auth, authorization, cookie, session id, credential, service key,
    subscription key, functions key, ...; in Korean 비밀번호, 암호, 토큰, 시크릿, API 키, 액세스 키, 인증 키, ...).
    Counting and naming keys are not secret: ``max_tokens``, ``prompt_tokens``, ``token_count``, ``tokenizer``,
    ``author``, ``authors``, ``토큰 수``, ``키``, ``pass_rate``, ``pass_count`` (``pass`` alone, ``db_pass``,
    ``passwd`` are), nor an exception's class name (``AuthenticationError``).
    Non-strings are never secret.
    """
    if not isinstance(key, str) or not key:
        return False
    if len(key) > _CACHED_KEY_CHARS:  # not a real key name: do not keep it in the cache
        return _is_secret_key.__wrapped__(key)
    return _is_secret_key(key)


@functools.lru_cache(maxsize=8192)
def _is_secret_key(key: str) -> bool:
    if key.isascii():
        if _EXCEPTION_CLASS_NAME.fullmatch(key) is not None:
            return False
    else:  # full-width and other compatibility forms: "ｐａｓｓｗｏｒｄ" is "password"
        key = unicodedata.normalize("NFKC", key)
    if _SECRET_KEY_FRAGMENTS.search(_KEY_SEPARATORS.sub("", key.lower())):
        return True
    words = _KEY_SEPARATORS.split(_CAMEL_BOUNDARY.sub("_", key).lower())
    return any(
        word in _SECRET_KEY_WORDS and (word != "pass" or i + 1 == len(words) or words[i + 1] not in _PASS_MEASURE_WORDS)
        for i, word in enumerate(words)
    )


# --- one-time codes -----------------------------------------------------------------------------------------
#
# A verification code, an OTP, a PIN or a card's security code is a credential while it is valid. But these names
# also label what is said about codes ("otp_ttl": 300, "mfa_users": 1203, "otp_sent_at": 1715923200) and other
# numbers called so (an Indian postal "pincode", a product's "KC 인증번호", a booking's "예약 확인 코드"). So such a
# name hides its value only where (_code_kind) its LAST word is the code itself ("otp", "user_otp",
# "verification_code", "card_pin", "인증번호"; not "otp_ttl", "pin_count", "인증번호_유효시간"), no word of it counts
# or bounds (_CODE_COUNT_WORDS), the word before it is no postal, booking or certification word (_NOT_A_CODE_OWNER),
# and the value has that code's shape (_CODE_SHAPES): a one-time code 4 to 8 digits ("482913", "482-913",
# "G-482913") or capitals mixed with digits ("7KQ2XA"), a PIN 4 digits, a card's security code 3 or 4.
CodeKind = Literal["one_time", "pin", "card", "security"]
_CODE_SHAPES: dict[CodeKind, re.Pattern[str]] = {
    "one_time": re.compile(
        r"[0-9]{4,8}|[0-9]{3,4}-[0-9]{3,4}|[A-Z]{1,3}-[0-9]{4,8}|(?=[A-Z]*[0-9])(?=[0-9]*[A-Z])[A-Z0-9]{6,10}"
    ),
    "pin": re.compile(r"[0-9]{4}"),  # "PIN 560001" is a postal code
    "card": re.compile(r"[0-9]{3,4}"),
    "security": re.compile(r"[0-9]{3,8}"),  # a card's "보안 코드", or one sent by mail ("security code")
}
# The words of a key, the case kept: on separators, camelCase ("cardPIN", "PINCode") and between Latin and Hangul
# ("KC인증번호", "OTP번호"); "2FA" and "cvv2" stay whole.
_CODE_KEY_WORD_BREAK = re.compile(
    r"[\s_.\-]+|(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])|(?<=[A-Za-z0-9])(?=[가-힣])|(?<=[가-힣])(?=[A-Za-z0-9])"
)
_ONE_TIME: CodeKind = "one_time"
_CARD: CodeKind = "card"
_CODE_NAMES: dict[str, CodeKind] = dict.fromkeys(("otp", "totp", "hotp"), _ONE_TIME) | dict.fromkeys(
    ("cvv", "cvc", "cvv2", "csc"), _CARD
)
# The words before "code" / "코드" that make it a one-time or a security code ("verification code", "sms_code",
# "인증코드", "보안 코드"); not "pin code" (a postal code), "확인 코드" (a booking's), "auth code" (an OAuth grant,
# or an HTTP status), "error code".
_CODE_OWNERS: dict[str, CodeKind] = dict.fromkeys(
    ("verification", "verify", "onetime", "login", "signin", "access", "sms", "twofactor", "2fa", "mfa", "otp",
     "totp", "인증", "일회용"),
    _ONE_TIME,
) | {"security": "security", "보안": "security"}  # fmt: skip
_NUMBER_OWNERS: dict[str, CodeKind] = {"인증": "one_time", "otp": "one_time", "핀": "pin"}  # "인증번호", "OTP 번호"
# The words before a lower-case "pin" that make it a PIN ("card_pin"); "map_pin", "pin" alone are words.
_PIN_OWNERS = frozenset(
    {"card", "atm", "debit", "credit", "sim", "account", "user", "login", "wallet", "payment", "transaction",
     "security", "new", "current", "temporary", "temp"}
)  # fmt: skip
# A word before a code's name that makes it another number: a postal PIN code, a certification number ("KC
# 인증번호", "안전 인증번호"), a booking's or an order's code.
_NOT_A_CODE_OWNER = frozenset(
    {"kc", "안전", "전파", "적합성", "예약", "주문", "배송", "우편", "shipping", "postal", "zip", "delivery",
     "booking", "reservation", "order", "confirmation", "pin"}
)  # fmt: skip
_CODE_SUFFIXES = ("code", "코드", "번호", "number")


def _code_kind(key: object) -> CodeKind | None:
    """The kind of one-time code or PIN ``key`` names (``otp``, ``verification_code``, ``PIN``, ``card_pin``,
    ``인증번호``, ``보안 코드``, ``cvv``), None where it names none or says something about codes (``otp_ttl``,
    ``mfa_users``, ``pincode``): its value is hidden where :func:`_is_code_value` for that kind."""
    if not isinstance(key, str) or not 0 < len(key) <= _CACHED_KEY_CHARS:
        return None
    return _code_kind_cached(key)


@functools.lru_cache(maxsize=4096)
def _code_kind_cached(key: str) -> CodeKind | None:
    if not key.isascii():
        key = unicodedata.normalize("NFKC", key)
    words = [word for word in _CODE_KEY_WORD_BREAK.split(key) if word]
    lowered = [word.lower() for word in words]
    if not lowered or not _CODE_COUNT_WORDS.isdisjoint(lowered):
        return None
    last = lowered[-1]
    kind: CodeKind | None = _CODE_NAMES.get(last)
    owner_at = len(words) - 2  # the word before the code's name
    if kind is None and last == "pin":
        owner = lowered[owner_at] if owner_at >= 0 else ""
        kind = "pin" if (words[-1] == "PIN" and not owner) or owner in _PIN_OWNERS else None
        owner_at -= 1
    elif kind is None:
        suffix = next((suffix for suffix in _CODE_SUFFIXES if last.endswith(suffix)), None)
        if suffix is None:
            return None
        if last != suffix:  # "verificationcode", "인증번호", "보안코드": the owner written onto it
            owner, owner_case = last[: -len(suffix)], words[-1][: -len(suffix)]
        else:
            owner = lowered[owner_at] if owner_at >= 0 else ""
            owner_case = words[owner_at] if owner_at >= 0 else ""
            if owner_at >= 1 and lowered[owner_at - 1] + owner in _CODE_OWNERS:  # "one_time_code", "sign-in code"
                owner_at -= 1
                owner = lowered[owner_at] + owner
            owner_at -= 1
        if suffix in ("code", "코드"):
            kind = _CODE_OWNERS.get(owner)
        elif owner_case == "PIN":  # "PIN number", "PIN 번호"; not "pin_number" (a GPIO pin's)
            kind = "pin"
        elif suffix == "번호":
            kind = _NUMBER_OWNERS.get(owner)
    if kind is None or (owner_at >= 0 and lowered[owner_at] in _NOT_A_CODE_OWNER):
        return None
    return kind


def _is_code_value(value: Any, kind: CodeKind) -> bool:
    """Whether ``value`` (a string, or an int that is not a bool) has the shape of a ``kind`` code
    (:data:`_CODE_SHAPES`): ``True``, ``6`` or ``"disabled"`` under ``otp`` say something about a code, ``482913`` is
    one; ``560001`` under ``PIN`` is a postal code."""
    if type(value) is int:
        return value >= 0 and _CODE_SHAPES[kind].fullmatch(str(value)) is not None
    return type(value) is str and _CODE_SHAPES[kind].fullmatch(value.strip()) is not None


# A secret's name written in a field of its own, apart from its value: ``{"name": "Authorization", "value": …}``
# (HAR, OpenAPI, Postman), ``{"name": "DB_PASSWORD", "value": …}`` (Kubernetes env), ``{"Key": …, "Value": …}``
# (AWS tags, SSM parameters), and ``("X-Api-Key", …)`` / ``[["X-Api-Key", …]]`` (header lists, ``dict.items()``).
def _field_names(*names: str) -> frozenset[str]:
    return frozenset(form for name in names for form in (name, name.lower(), name[0].upper() + name[1:], name.upper()))


_NAME_FIELDS = _field_names(
    "name", "key", "header", "field", "param", "parameter", "variable", "var", "env",
    "headerName", "header_name", "fieldName", "field_name", "paramName", "param_name", "keyName", "key_name",
)  # fmt: skip
_VALUE_FIELDS = _field_names("value", "val", "content", "secret")
_NAMED_VALUE_MAX_FIELDS = 12  # a name/value entry is small; a larger dict is a record whose "name" names it
# What such a name looks like: a header, variable or parameter name, no spaces (a title "Password policy" in a
# "name" field does not hide its sibling "content"). A dotted or path-like name ("spring.datasource.password",
# "/prod/db/password") names a secret by its last part only: a file "auth.py" does not hide its "content".
_NAME_SHAPE = re.compile(r"[\w-]{1,128}")
_PATH_NAME_SHAPE = re.compile(r"[\w\-./:]{1,128}")
_LAST_NAME_PART = re.compile(r"[\w-]*\Z")


def _is_secret_name(name: str) -> bool:
    """Whether ``name``, a string standing apart from its value, names a secret (see :data:`_NAME_SHAPE`)."""
    return len(name) <= 128 and _is_secret_name_cached(name)


@functools.lru_cache(maxsize=4096)
def _is_secret_name_cached(name: str) -> bool:
    if _NAME_SHAPE.fullmatch(name) is not None:
        return is_secret_key(name)
    if _PATH_NAME_SHAPE.fullmatch(name) is not None:
        last = _LAST_NAME_PART.search(name)
        return last is not None and is_secret_key(last[0])
    return False


def _named_secret_values(fields: Mapping[Any, Any]) -> frozenset[Any] | None:
    """The value fields of ``fields`` to mask because a name field beside them names a secret (None: none)."""
    for field in _NAME_FIELDS.intersection(fields):
        name = fields[field]
        if type(name) is str and _is_secret_name(name):
            return _VALUE_FIELDS.intersection(fields) or None
    return None


def _is_secret_pair(pair: tuple[Any, ...] | list[Any]) -> bool:
    """Whether a 2-item sequence is ``(name, value)`` whose name names a secret (and whose value is not empty), and
    not two names (:func:`_are_variable_names`)."""
    return (
        len(pair) == 2
        and type(pair[0]) is str
        and not _is_empty(pair[1])
        and _is_secret_name(pair[0])
        and not (type(pair[1]) is str and _are_variable_names(pair[0], pair[1]))
    )


# An environment variable's name as a list of them writes it: capitals, digits and at least one underscore, each
# part starting with a letter ("API_TOKEN", "AWS_S3_BUCKET"; not "SUMMER_2024", "PGPASSWORD", "ADMIN").
_VARIABLE_NAME_SHAPE = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z][A-Z0-9]*)+")


def _are_variable_names(first: str, second: str) -> bool:
    """Whether ``first`` and ``second`` are both variable names: a list of two names (a server's ``public_env``,
    ``["API_TOKEN", "DB_PASSWORD"]``), not a ``(name, value)`` pair whose value an auditor must not see. Narrow on
    purpose, as a value taken for a name is shown: a header's value ("abc…", "Bearer …") or a secret's (a token,
    a password with a digit part or no underscore) has not this shape. A placeholder such as ``CHANGE_ME`` has it,
    and is shown; a value the platform binds is a known secret, masked wherever it appears whatever its shape."""
    return _VARIABLE_NAME_SHAPE.fullmatch(first) is not None and _VARIABLE_NAME_SHAPE.fullmatch(second) is not None


# --- known secret values ----------------------------------------------------------------------------------

_registry_lock = threading.Lock()
_registered: frozenset[str] = frozenset()
_process_secrets: frozenset[str] = frozenset()
_known: frozenset[str] = frozenset()
"""Both sets above, kept joined as they change: every mask reads this one (no union per call), so the matcher of
the same known set is built once and found in the cache after."""


def credential_like(value: str) -> bool:
    """Whether another binding's secret is one worth masking beyond its own server: 8 characters or more, not
    digits alone (a short or numeric secret, ``none``, ``3600``, a setting an admin kept secret, would hide words
    and numbers everywhere)."""
    text = value.strip()
    return len(text) >= 8 and not text.isdigit()


def register_secrets(values: Iterable[str]) -> None:
    """Add values to the process-wide set of known secrets, masked by every later call.

    Thread-safe. Values shorter than :data:`MIN_SECRET_LENGTH` are ignored; a value with surrounding
    whitespace is also registered stripped. A ``str`` is taken as one value, a mapping as its values.
    """
    global _registered, _known
    new = _normalise_secrets(values)
    if not new:
        return
    with _registry_lock:
        if not new <= _registered:
            _registered = _registered | new
            _known = _registered | _process_secrets


def register_process_secrets(values: Iterable[str]) -> None:
    """Add the process's own secrets (its settings' keys and passwords: ``audit.apps`` registers them at start)
    to those every later call masks, as :func:`register_secrets` does; unlike those, they are not forgotten by
    :func:`clear_registered_secrets` (a test starts without the bindings' secrets of the tests before it, never
    without the process's own) nor listed by :func:`registered_secrets`. Thread-safe; normalised as
    :func:`register_secrets` normalises."""
    global _process_secrets, _known
    new = _normalise_secrets(values)
    if not new:
        return
    with _registry_lock:
        if not new <= _process_secrets:
            _process_secrets = _process_secrets | new
            _known = _registered | _process_secrets


def registered_secrets() -> frozenset[str]:
    """The process-wide set of secrets given to :func:`register_secrets` (as normalised by it)."""
    return _registered


def clear_registered_secrets() -> None:
    """Forget every secret given to :func:`register_secrets`; the process's own
    (:func:`register_process_secrets`) stay. Meant for tests."""
    global _registered, _known
    with _registry_lock:
        _registered = frozenset()
        _known = _process_secrets


def _normalise_secrets(values: Iterable[str] | str | Mapping[Any, Any] | None) -> frozenset[str]:
    """The usable secret values of ``values``.

    Forgiving on purpose, because a mistake here fails open: one ``str`` is one secret (not its characters),
    a mapping contributes its values (not its keys), ``None`` items are skipped, bytes are decoded and other
    objects are taken as ``str(item)``.
    """
    if values is None:
        return frozenset()
    if isinstance(values, (str, bytes)):
        values = (values,)
    elif isinstance(values, Mapping):
        values = values.values()
    found: set[str] = set()
    for item in values:
        if item is None:
            continue
        if isinstance(item, (bytes, bytearray)):
            item = bytes(item).decode("utf-8", "replace")
        elif not isinstance(item, str):
            item = str(item)
        for candidate in (item, item.strip(), *_credential_parts(item)):
            if len(candidate) >= MIN_SECRET_LENGTH:
                found.add(candidate)
    return frozenset(found)


# An Authorization-style value: a scheme, then the credential (which a server may quote without its scheme).
_AUTH_SCHEME_VALUE = re.compile(
    r"(?i)\s*(?P<scheme>bearer|basic|token|apikey|api-key|key|bot|jwt|dpop|hmac|negotiate|sso)\s+(?P<credential>\S+)\s*"
)


def _credential_parts(value: str) -> list[str]:
    """The parts of a secret value that are secrets on their own: the credential of ``Bearer <token>`` (and of
    ``Basic <base64>``, its decoded ``user:password`` and the password), the password of a URL's userinfo
    (``postgres://user:pw@host/db``). A server that quotes only the part is masked too."""
    parts: list[str] = []
    found = _AUTH_SCHEME_VALUE.fullmatch(value)
    if found is not None:
        credential = found["credential"]
        parts.append(credential)
        if found["scheme"].lower() == "basic":
            with contextlib.suppress(ValueError, binascii.Error, UnicodeDecodeError):
                decoded = base64.b64decode(credential, validate=True).decode("utf-8")
                parts.append(decoded)
                user, sep, password = decoded.partition(":")
                if sep and password != user:
                    parts.append(password)
    if "://" in value and "@" in value:
        with contextlib.suppress(ValueError):
            split = urlsplit(value.strip())
            if split.password and split.password != split.username:
                parts.extend({split.password, unquote(split.password)})
    # A part stands alone in text only where it could not be an ordinary word or number: a weak password
    # ("postgres", "admin", "2024") masked on its own would mask the word, or every year, everywhere.
    return [part for part in parts if _distinctive(part)]


def _distinctive(part: str) -> bool:
    return len(part) >= MIN_ENCODED_SECRET_LENGTH and (len(part) >= 16 or not (part.isalpha() or part.isdigit()))


def _normalization_variants(secret: str) -> set[str]:
    """``secret`` in either Unicode normalization form: a Korean secret bound composed (NFC) may come back decomposed
    (NFD, as macOS file names and some servers write it), or the reverse: the same text to a reader, other code
    points (and other bytes to encode) to a matcher. And compatibility-composed (NFKC): a secret bound with full-width
    letters (``암호Ａ１２３４``) echoed half-width, or disguised (folded text reads it half-width)."""
    if secret.isascii():
        return {secret}
    return {
        secret,
        unicodedata.normalize("NFC", secret),
        unicodedata.normalize("NFD", secret),
        unicodedata.normalize("NFKC", secret),
    }


def _secret_forms(secret: str) -> set[str]:
    """``secret`` as it may appear in text: raw, base64, URL-encoded, JSON-escaped, HTML-escaped, in either Unicode
    normalization form (:func:`_encoded_forms` of each)."""
    forms: set[str] = set()
    for variant in _normalization_variants(secret):
        forms |= _encoded_forms(variant)
    return forms


def _encoded_forms(secret: str) -> set[str]:
    raw = secret.encode("utf-8")
    forms = {secret} | _base64_forms(raw)
    for url_form in (quote(secret, safe=""), quote(secret), quote_plus(secret), quote_plus(secret, safe="/")):
        forms.add(url_form)
        forms.add(_PERCENT_ESCAPE.sub(lambda m: m[0].lower(), url_form))
    for json_form in (json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]):
        forms.add(json_form)
        # JSON may escape "/" ("\\/": PHP's json_encode, Java libraries), which ``json.dumps`` never does.
        forms.add(json_form.replace("/", "\\/"))
    html_form = html.escape(secret)
    forms.add(html_form)
    if "/" in secret:  # "/" as HTML escapers that go beyond ``html.escape`` write it
        forms |= {html_form.replace("/", entity) for entity in ("&#x2F;", "&#x2f;", "&#47;")}
    if len(secret) >= MIN_ENCODED_SECRET_LENGTH:
        forms |= _hex_base32_forms(raw) | {secret[::-1], secret.upper(), secret.lower()}
        # Every byte percent-encoded, letters too (``%72%76%54…``: what ``quote`` leaves readable, a tool echoing
        # the secret disguised may encode): upper- and lower-case hex.
        every_byte = "".join(f"%{byte:02X}" for byte in raw)
        forms |= {every_byte, every_byte.lower()}
    return {form for form in forms if len(form) >= MIN_SECRET_LENGTH}


def _base64_forms(raw: bytes) -> set[str]:
    """``raw`` in base64, standard and URL-safe, with and without padding, and its :func:`_base64_cores`."""
    forms: set[str] = set()
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        encoded = encode(raw).decode("ascii")
        forms |= {encoded, encoded.rstrip("=")} | _base64_cores(raw, encode)
    return forms


def _hex_base32_forms(raw: bytes) -> set[str]:
    """``raw`` in hex and in base32, each in either case. Base32 with and without padding, and its characters that
    depend on its bytes alone where it starts a group of five bytes inside a longer encoded text (a config file
    encoded whole). At the other four offsets it is not matched: five more forms per case that could start with any
    letter would make every text's scan markedly slower."""
    b32 = base64.b32encode(raw).decode("ascii")
    forms = {raw.hex(), b32, b32.rstrip("="), b32[: 8 * len(raw) // 5]}
    return forms | {form.upper() for form in forms} | {form.lower() for form in forms}


def _base64_cores(raw: bytes, encode: Any) -> set[str]:
    """The characters of ``raw``'s base64 that depend on its bytes alone, at each of the three offsets it can
    start at inside a longer encoded text (``base64("Bearer " + secret)``, ``base64("user:" + secret)``): the
    characters that mix in the bytes around it are left out."""
    cores = set()
    bits = 8 * len(raw)
    for offset in range(3):
        encoded = encode(b"\0" * offset + raw + b"\0\0").decode("ascii")
        start = -(-8 * offset // 6)  # the first character wholly inside the secret's bits
        end = (8 * offset + bits) // 6  # one past the last such character
        if end - start >= MIN_ENCODED_SECRET_LENGTH:
            cores.add(encoded[start:end])
    return cores


def _splittable_forms(secret: str) -> set[str]:
    """The forms of ``secret`` that are also masked with whitespace between any two of their characters (a value
    split over lines; ``base64.encodebytes`` and PEM wrapping at 64 or 76 columns; ``xxd``'s ``6372 6d54 …``; base32
    wrapped): the value without its own whitespace, and for values of :data:`MIN_ENCODED_SECRET_LENGTH` characters
    or more its base64 (:func:`_base64_forms`), hex and base32 (:func:`_hex_base32_forms`) forms, in either Unicode
    normalization form. Only for long enough values; the unbroken forms are matched by the literal forms."""
    forms: set[str] = set()
    for variant in _normalization_variants(secret):
        chars = "".join(c for c in variant if not c.isspace())
        if len(chars) < MIN_ENCODED_SECRET_LENGTH:
            continue
        forms.add(chars)
        if len(variant) < MIN_ENCODED_SECRET_LENGTH:
            continue
        raw = variant.encode("utf-8")
        forms |= _base64_forms(raw) | _hex_base32_forms(raw)
    return forms


_PERCENT_ESCAPE = re.compile(r"%[0-9A-F]{2}")


_WHITESPACE = re.compile(r"\s")  # what ``str.isspace`` finds, at C speed
_SPLIT = r"\s*"  # what may stand between two characters of a splittable form: spaces, tabs, line breaks


class _SecretMatcher:
    """One compiled regex matching every form of a set of secrets, longest first."""

    __slots__ = ("beyond_ascii", "gate", "memos", "numbers", "pattern", "recheck", "spaced")

    def __init__(self, forms: Iterable[str], spaced: Iterable[str] = (), numbers: Iterable[str] = ()) -> None:
        self.memos = _Memos()
        # The secrets made of digits only (a PIN, an account number): a JSON number equal to one is masked too.
        self.numbers = frozenset(numbers)
        forms, spaced = set(forms), set(spaced)
        self.pattern = _compile_words(forms)
        # A secret containing "*" can reappear next to an inserted MASK: such sets are re-checked.
        self.recheck = any("*" in form for form in forms)
        # A secret not in ASCII (Korean): hidden characters between its letters, and compatibility forms of its ASCII
        # letters, are looked for anywhere in a text that holds any (``_sub_folded``), not only between ASCII letters.
        self.beyond_ascii = not all(form.isascii() for form in forms)
        # Whitespace-split forms (:func:`_splittable_forms`), ``\s*`` between any two characters: only tried where the
        # text has whitespace.
        self.spaced = _compile_words(spaced, separator=_SPLIT) if spaced else None
        # Every form with its whitespace taken out: a text with whitespace in which none is found once its whitespace
        # is taken out holds no form, split or not. One pass (most texts: a tool's result, a log line) instead of the
        # two of the literal and the split forms. Mostly the literal forms themselves (no secret with whitespace).
        gate = {"".join(form.split()) for form in forms | spaced} - {""}
        self.gate = self.pattern if gate == forms else _compile_words(gate) if gate else None

    def sub(self, text: str) -> str:
        if _WHITESPACE.search(text) is None:
            text = self.pattern.sub(MASK, text)
        elif self.gate is None or self.gate.search("".join(text.split())) is None:  # split: what ``\s`` finds
            return self._sub_folded(text)
        else:  # the split forms first: a form split after its first characters is masked whole, not the part of it
            # that is a literal form (a base32 core before its last character and padding on the next line)
            if self.spaced is not None:
                text = self.spaced.sub(MASK, text)
            text = self.pattern.sub(MASK, text)
        if self.recheck:  # every round shortens the text (forms are longer than MASK), so this ends
            while (again := self.pattern.sub(MASK, text)) != text:
                text = again
        return self._sub_folded(text)

    def _sub_folded(self, text: str) -> str:
        """``text`` with each form found where a secret may be disguised (:func:`_disguised_runs`, read as
        :func:`_fold` undoes it) masked where it stands in ``text``: the characters its first and last come from and
        all between (the hidden ones between its letters too)."""
        spans: list[tuple[int, int]] = []
        if self.beyond_ascii:
            # A secret not in ASCII (Korean, or Korean with ASCII letters) is in no run (those hold ASCII and its
            # disguises only): the whole text is read wherever it holds anything :func:`_fold` undoes, whatever else
            # it holds (a full-width digit elsewhere once left a Korean secret with hidden characters in clear).
            runs = [(0, len(text))] if _folding().search(text) is not None else []
        else:
            runs = _disguised_runs(text)
        for run_start, run_end in runs:
            patterns = (self.spaced, self.pattern) if _WHITESPACE.search(text, run_start, run_end) else (self.pattern,)
            run = text[run_start:run_end]
            folded = _folded(run) if self.beyond_ascii else run.translate(_fold_table())  # a run: mostly disguise
            if not any(p is not None and p.search(folded) for p in patterns):
                continue  # most runs hold none (read at C speed); mapped back only where one is found
            plain, origin = _fold(run)
            spans += [
                (run_start + origin[m.start()], run_start + origin[m.end() - 1] + 1)
                for pattern in patterns
                if pattern is not None
                for m in pattern.finditer(plain)
                if m.end() > m.start()
            ]
        if not spans:
            return text
        pieces, done = [], 0
        for start, end in sorted(spans):
            if end <= done:  # within one masked already (a split form and its literal part)
                continue
            if start >= done:
                pieces += [text[done:start], MASK]
            done = end
        return "".join(pieces) + text[done:]


# The ASCII characters that do not show themselves, whitespace apart (the split forms match across that).
_ASCII_SHOWN = bytes(code for code in range(128) if chr(code).isprintable() or chr(code).isspace())


@functools.cache
def _disguising() -> tuple[re.Pattern[str], frozenset[str], frozenset[str]]:
    """Where a secret (ASCII, as keys and tokens are) may be disguised in a text: a character NFKC makes ASCII (a
    full-width ``ｂ``, ``㎏``, a mathematical bold ``𝐛``), or characters that do not show themselves
    (``audit.visible``) between two that are or may be ASCII (``b\u200bk``). Returns a pattern that finds them at C
    speed (below U+10000 exactly; above, every character but the pictographs, checked one by one after it), the
    characters NFKC makes ASCII, and those that do not show themselves. Built on first use."""
    folded = [
        (c, c)
        for c in range(0x80, 0x20000)
        if (form := unicodedata.normalize("NFKC", chr(c))) != chr(c) and form.isascii() and form.isprintable()
    ]
    to_ascii, hidden = merged_ranges(folded), hidden_ranges(spaces=False)

    def below(ranges: tuple[tuple[int, int], ...]) -> str:
        return "".join(f"\\U{low:08X}-\\U{high:08X}" for low, high in ranges if high <= 0xFFFF)

    # Above U+FFFF: one class of two ranges that leaves out only the pictographs and emoticons (U+1F200–U+1FAFF,
    # which hold neither; checked one by one after it); a class of the exact ranges there is tested range by range
    # at every character of a text, sixty times slower on Korean text than a look-up.
    above = [r for r in (*to_ascii, *hidden) if r[1] > 0xFFFF]
    assert not [r for r in above if r[0] <= 0x1FAFF and r[1] >= 0x1F200], "a disguise among the pictographs"
    fold, shown = below(to_ascii), "\\s!-~" + below(to_ascii)  # whitespace too: a secret split over two lines
    found = re.compile(
        f"[{fold}]+|[{shown}][{below(hidden)}]+[{shown}]|[\\U00010000-\\U0001F1FF\\U0001FB00-\\U0010FFFF]"
    )

    def characters(ranges: tuple[tuple[int, int], ...]) -> frozenset[str]:
        return frozenset(chr(code) for low, high in ranges for code in range(low, high + 1))

    return found, characters(to_ascii), characters(hidden)


@functools.cache
def _fold_table() -> dict[int, str | None]:
    """:func:`_fold`'s undoing as a ``str.translate`` table: each character NFKC makes ASCII to its NFKC form, each
    that does not show itself (whitespace apart) to nothing."""
    _found, to_ascii, hidden = _disguising()
    table: dict[int, str | None] = {ord(c): unicodedata.normalize("NFKC", c) for c in to_ascii}
    table.update({ord(c): None for c in hidden})
    return table


@functools.cache
def _folding() -> re.Pattern[str]:
    """A pattern that finds each run of the characters :func:`_fold_table` changes: exactly below U+10000, above it
    every character but the pictographs (as :func:`_disguising`'s; a character it changes not is kept)."""
    ranges = merged_ranges([(code, code) for code in _fold_table()])
    below = "".join(f"\\U{low:08X}-\\U{min(high, 0xFFFF):08X}" for low, high in ranges if low <= 0xFFFF)
    return re.compile(f"[{below}\\U00010000-\\U0001F1FF\\U0001FB00-\\U0010FFFF]+")


def _folded(text: str) -> str:
    """``text`` translated by :func:`_fold_table`, only where :func:`_folding` finds something: ``str.translate``
    looks each character of a (Korean) text up in the table, several times slower where it holds few to undo."""
    table = _fold_table()
    return _folding().sub(lambda match: match[0].translate(table), text)


def _disguised_runs(text: str) -> list[tuple[int, int]]:
    """The spans of ``text`` in which a secret may stand disguised (:func:`_disguising`), or none (most texts, known
    at C speed): around each character NFKC makes ASCII, and each run of hidden ones between two characters that
    are or may be ASCII, the run of such characters, ASCII and whitespace a disguised secret is made of. Korean
    text (NFKC changes its compatibility jamo, ``ㅋ``, into other Hangul, not ASCII) and emoji joined by a
    zero-width joiner hold none: a pass over each character of such a text was five to sixty times slower."""
    if text.isascii():  # an ASCII control character between a secret's letters: the whole text, read at C speed
        shown = text.isprintable() or not text.encode("ascii").translate(None, _ASCII_SHOWN)
        return [] if shown else [(0, len(text))]
    found, to_ascii, hidden = _disguising()
    if found.search(text) is None:
        return []

    def part(character: str) -> bool:  # of a disguised secret: ASCII, whitespace or disguise
        return (character.isascii() and (character.isprintable() or character.isspace())) or character in to_ascii

    spans: list[tuple[int, int]] = []
    end, read = len(text), 0  # ``read``: where the run of hidden characters looked at last ends
    for match in found.finditer(text):
        at = match.start()
        if at < read or (spans and at < spans[-1][1]):
            continue
        character = match.group()
        if ord(character[0]) > 0xFFFF and character not in to_ascii:  # above U+FFFF: found by a wider class
            if character not in hidden:
                continue
            before, after = at - 1, at + 1
            while before >= 0 and text[before] in hidden:
                before -= 1
            while after < end and text[after] in hidden:
                after += 1
            read = after  # each hidden character of a run looked at once (a flood of 19,000 took 80 s)
            if before < 0 or after >= end or not part(text[before]) or not part(text[after]):
                continue
        start, stop = at, at + 1
        while start > 0 and (part(text[start - 1]) or text[start - 1] in hidden):
            start -= 1
        while stop < end and (part(text[stop]) or text[stop] in hidden):
            stop += 1
        spans.append((start, stop))
    return spans


def _fold(text: str) -> tuple[str, list[int]]:
    """``text`` as a server may have disguised a secret in it, undone (:func:`_fold_table`: without the characters
    that do not show themselves, a zero-width space, a soft hyphen, a tag character between a secret's letters;
    whitespace stays, the split forms match across it; each compatibility character in its NFKC form, a full-width
    ``ｂｋＴｏｋ…`` is ``bkTok…``); with, for each of its characters, the index in ``text`` of the one it comes from."""
    table = _fold_table()
    plain: list[str] = []
    origin: list[int] = []
    for at, character in enumerate(text):
        form = table.get(ord(character), character)
        if form:
            plain.append(form)
            origin += [at] * len(form)
    return "".join(plain), origin


def _compile_words(words: set[str], *, separator: str = "") -> re.Pattern[str]:
    """:func:`_trie_regex` of ``words`` compiled (a plain alternation, longest first, for a pathological set)."""
    ordered = sorted(words, key=lambda word: (-len(word), word))
    try:
        return re.compile(_trie_regex(ordered, separator=separator))
    except (RecursionError, re.error, OverflowError):
        return re.compile("|".join(separator.join(map(re.escape, word)) for word in ordered))


def _trie_regex(words: list[str], *, separator: str = "") -> str:
    """A regex matching any of ``words`` (longest at a position wins), factored as a prefix trie; ``separator``
    (a regex) is allowed between any two characters of a word, never before its first or after its last.

    Python's ``re`` tries alternatives one by one; a trie makes it fail after one character per branch
    point instead of once per word, several times faster for dozens of secrets.
    """
    end = ""  # marks "a word ends here"; real trie edges are single characters
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[end] = {}

    def build(node: dict[str, Any], lead: str) -> str:
        branches = []
        for char in sorted(k for k in node if k != end):
            piece, child = lead + re.escape(char), node[char]
            while len(child) == 1 and end not in child:  # collapse single-child chains
                ((next_char, child),) = child.items()
                piece += separator + re.escape(next_char)
            branches.append(piece + build(child, separator))
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        # Greedy optional: longer words first. The separator is inside it, so a word ending here takes none.
        return f"(?:{body})?" if end in node else body

    return build(trie, "")


@functools.lru_cache(maxsize=128)
def _matcher_for(secrets: frozenset[str]) -> _SecretMatcher | None:
    """The (cached) matcher of a secret set; a changed set is a new key, so the cache never goes stale."""
    if not secrets:
        return None
    forms: set[str] = set()
    spaced: set[str] = set()
    for secret in secrets:
        forms |= _secret_forms(secret)
        spaced |= _splittable_forms(secret)
    numbers = {secret.strip() for secret in secrets if _DIGITS.fullmatch(secret.strip())}
    return _SecretMatcher(forms, spaced, numbers)


_DIGITS = re.compile(r"-?[0-9]+")


def _secret_number(value: Any, numbers: frozenset[str]) -> bool:
    """Whether ``value`` (an int or a float, not a bool) is a secret made of digits, as a JSON number."""
    if type(value) is int:
        return str(value) in numbers
    if type(value) is float and value.is_integer():
        return str(int(value)) in numbers
    return False


def _resolve_matcher(secrets: Iterable[str] | None) -> _SecretMatcher | None:
    extra = _normalise_secrets(secrets) if secrets else frozenset()
    registered = _known
    if extra and not extra <= registered:
        return _matcher_for(registered | extra)
    return _matcher_for(registered)


# --- value patterns -----------------------------------------------------------------------------------------
#
# Each pattern has a cheap gate (``in`` checks, C speed) so that text which cannot match skips its regex scan,
# and regexes start with a literal where possible so ``re`` can jump between candidate positions.

_PEM_PRIVATE_KEY = re.compile(
    r"(?P<begin>-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----)"
    r".*?"
    r"(?P<end>-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)",  # a cut-off block is masked to the end
    re.DOTALL,
)
_JWT = re.compile(r"eyJ(?<![A-Za-z0-9_-]eyJ)[A-Za-z0-9_-]++\.eyJ[A-Za-z0-9_-]++\.[A-Za-z0-9_-]*+")
_AWS_ACCESS_KEY_ID = re.compile(r"A(?:KIA|SIA)(?<![A-Z0-9]....)[A-Z0-9]{16}(?![A-Z0-9])")
# Well-known API key formats. Each branch starts with its literal prefix (so ``re`` can jump to candidates) and
# then looks back to check the prefix is not the tail of a longer word ("task-manager" is not "sk-...").
_API_KEY_PREFIX = re.compile(r"sk-|[sr]k_|whsec_|xox|gh[pousr]_|github_pat_|glpat-|AIza|apk_")
_API_KEY_SHAPES = re.compile(
    r"sk-(?<![A-Za-z0-9_-]sk-)[A-Za-z0-9_-]{8,}"  # OpenAI / Anthropic style
    r"|sk_(?:live|test)_(?<![A-Za-z0-9_-].{8})[A-Za-z0-9]{8,}"  # Stripe secret
    r"|rk_(?:live|test)_(?<![A-Za-z0-9_-].{8})[A-Za-z0-9]{8,}"  # Stripe restricted
    r"|whsec_(?<![A-Za-z0-9_-]whsec_)[A-Za-z0-9]{16,}"  # Stripe webhook secret
    r"|xox[abposr]-(?<![A-Za-z0-9_-].{5})[A-Za-z0-9-]{8,}"  # Slack
    r"|gh[pousr]_(?<![A-Za-z0-9_-].{4})[A-Za-z0-9]{20,}"  # GitHub
    r"|github_pat_(?<![A-Za-z0-9_-]github_pat_)[A-Za-z0-9_]{20,}"
    r"|glpat-(?<![A-Za-z0-9_-]glpat-)[A-Za-z0-9_-]{20,}"  # GitLab
    r"|AIza(?<![A-Za-z0-9_-]AIza)[0-9A-Za-z_-]{35}"  # Google API key
    # This platform's own API keys (agents.services.API_KEY_PREFIX and token_urlsafe(32): exactly 43 characters,
    # so an identifier such as apk_analyzer_get_permissions is not one); the 12-character prefix the admin and
    # the audit name a key by is shorter, and stays.
    r"|apk_(?<![A-Za-z0-9_-]apk_)[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])"
)
_URL_USERINFO = re.compile(r"(?P<head>://[^\s:/?#@\"'<>]*:)[^\s/?#\"'<>]+(?=@)")
_QUERY_PARAMETER = re.compile(  # only parameters whose name has a secret-ish word reach the callback
    r"(?P<head>[?&](?:amp;)?"
    r"(?=[A-Za-z0-9_.\-\[\]]*?(?i:key|sig|pass|pw|token|secret|auth|session|cookie|credential))"
    r"(?P<name>[A-Za-z0-9_.\-\[\]]++)=)"
    r"(?P<value>[^&#\s\"'<>]+)"
)
_SECRET_QUERY_NAMES = frozenset({"key", "sig", "pass", "pw"})
_AWS_SECRET_LABELLED = re.compile(  # "aws_secret_access_key=", "SecretAccessKey: ", "\"secret_key\": \""
    r"(?P<head>[Ss][Ee][Cc][Rr][Ee][Tt][-_.]?(?:[Aa][Cc][Cc][Ee][Ss][Ss][-_.]?)?[Kk][Ee][Yy]"
    r"\\?[\"']?[ \t]*[:=][ \t]*\\?[\"']?)"
    r"[A-Za-z0-9/+=]{40}(?![A-Za-z0-9/+=])"
)
_AUTH_SCHEME_CREDENTIAL = re.compile(
    r"(?P<head>(?P<scheme>[Bb][Ee][Aa][Rr][Ee][Rr](?<![A-Za-z0-9].{6})|[Bb][Aa][Ss][Ii][Cc](?<![A-Za-z0-9].{5}))"
    r"[ \t]+)"
    r"(?P<credential>[A-Za-z0-9\-._~+/]+=*)"
)
_NOT_ONLY_LETTERS = re.compile(r"[^A-Za-z]")
# A secret pair URL-encoded (a form or a JSON body inside a URL or a log line): "password%3Dhunter22",
# "%22password%22%3A%22hunter22%22". Found from its encoded "=" or ":" (a literal: ``re`` jumps between them),
# the key read backwards from there; the value ends at an encoded quote, "&", ",", ";", space, newline or "}".
_ENCODED_SEPARATOR = re.compile(r"%(?:22%3[DdAa]|3[DdAa])(?:%20|\+)*+(?:%22)?")
_ENCODED_VALUE = re.compile(r"(?:[^\s&%\"'<>;,]|%(?!2[26Cc]|3[Bb]|20|0[AaDd]|[57][Dd])[0-9A-Fa-f]{2})++")
_ENCODED_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
# An XML element named for a secret: "<password>hunter22</password>", "<db:Password a='1'>…</db:Password>".
_XML_ELEMENT = re.compile(
    r"<(?P<name>[A-Za-z_][\w.\-]*+(?::[A-Za-z_][\w.\-]*+)?)(?P<attributes>[ \t][^<>/]*+)?+>"
    r"(?P<value>[^<]++)</(?P=name)>"
)
# A command-line option naming a secret, its value after a space: "--password hunter22", "--api-key 'x y'".
# ("--password=hunter22" is a key=value pair.) The value is one word, not another option, not a placeholder.
_SECRET_OPTION = re.compile(
    r"--(?<![\w-]--)(?P<name>[A-Za-z][\w-]*+)[ \t]++"
    r"(?P<value>\"[^\"\n]*+\"|'[^'\n]*+'|[^\s\"'`<>|;&(){}\[\]\-][^\s\"'`|;&]*+)"
)
_PROSE_AFTER_OPTION = frozenset(
    {"flag", "option", "options", "argument", "parameter", "switch", "is", "and", "or", "to", "the", "with", "for",
     "in", "of", "if", "on", "must", "should", "can", "will", "was", "not", "only", "as", "value", "instead"}
)  # fmt: skip
# A client's password glued to its option: "mysql -u root -phunter22" (mysql's "-p" takes no space), and
# "sshpass -p hunter22 ssh host". Only after one of these commands, on the same line, within its first twelve
# words (an unbounded look ahead from every "mysql" made masking a long text quadratic): elsewhere "-p" is a port.
_PASSWORD_OPTION = re.compile(
    r"(?<![\w-])(?:(?:mysql|mariadb)[\w-]*+(?:[ \t]++[^\s;|&]++){0,12}?[ \t]++-p|sshpass[ \t]++-p[ \t]*+)"
    r"(?P<value>[^\s\"'`;|&]++)"
)
# A name and its value in text, apart: '{"name": "Authorization", "value": "…"}' (JSON of a HAR or Kubernetes
# entry), "('X-Api-Key', '…')" and '["X-Api-Key", "…"]' (a header list's repr or JSON).
# Found from the value field (after a ",": a literal), the name field read backwards from there: one match of
# this pattern, written backwards, on the reversed text before the ",".
_VALUE_FIELD_TEXT = re.compile(r",[ \t]*+\\?[\"'](?i:value|val|content|secret)\\?[\"'][ \t]*+:[ \t]*+")
_NAME_FIELD_BEFORE_REVERSED = re.compile(
    r"[ \t]*+[\"']\\?(?P<name>[\w-]{1,128}+)[\"']\\?[ \t]*+:[ \t]*+[\"']\\?(?i:eman|yek|redaeh|dleif|marap)[\"']"
)
_NAME_FIELD_BEFORE_CHARS = 160
_PAIR_TEXT = re.compile(r"[\[(][ \t]*+(?P<quote>\\?[\"'])(?P<name>[\w-]{1,128}+)(?P=quote)[ \t]*+,[ \t]*+")
_PAIR_TEXT_END = re.compile(r"[ \t]*+[\])]")
_PAIR_TEXT_OPENINGS = ('["', "['", '("', "('", '[\\"', "[ ", "( ")  # its gate: a quote (or a space) after "[" or "("
_URLSAFE_TO_STANDARD = str.maketrans("-_", "+/")

# "key=value", "key: value", "\"key\": \"value\"", "'key': 'value'", "\\\"key\\\": \\\"value\\\"" (JSON in JSON).
# Tried only where a secret-ish word occurs (found in the lower-cased text by _PAIR_KEY_WORD); the value is
# matched only once is_secret_key() (or _code_kind()) accepted the key, so a rejected key never costs a scan of
# its value.
# A key may be two words when the second is one a credential's label ends with: Korean writes "API 키",
# "액세스 키", "비밀 번호", "토큰 값", "보안 코드" with a space (as English writes "Secret Key", "Verification Code",
# "PIN Number"). Only these words: any second word would make "토큰 만료: 3600" (a token's lifetime) a key "토큰만료"
# that names a token, and hide the number. A password's label may also end with the word that asks for it again
# ("비밀번호 확인", "Password confirmation": the same password), after a password word only: "토큰 확인: 성공" keeps
# its result.
# The separator may be full-width ("비밀번호：…", "password＝…"), as Korean and Japanese input methods type it.
_PAIR_HEAD = re.compile(
    r"""
    (?<![A-Za-z0-9_.\-가-힣])
    (?P<quote>\\?["']|)
    (?P<key>[A-Za-z0-9_.\-가-힣]++
      (?:[ \t](?:키|번호|값|토큰|코드|[Kk][Ee][Yy]|[Cc][Oo][Dd][Ee])
        |(?<=[Pp][Ii][Nn])[ \t][Nn][Uu][Mm][Bb][Ee][Rr]
        |(?:(?<=번호)|(?<=비번)|(?<=암호)|(?<=[Ww][Oo][Rr][Dd]))[ \t](?:확인|재확인|재입력|[Cc]onfirm(?:ation)?)
      )?)
    (?P=quote)
    [ \t]*[:=：＝][ \t]*
    """,
    re.VERBOSE,
)
_PAIR_VALUE = re.compile(
    r"""
        "(?:[^"\\\n]|\\.)*"
      | '(?:[^'\\\n]|\\.)*'
      | \\".*?\\"
      | \\"[^\n]*                       # cut off (a truncated preview): to the end of the line
      | ["'](?:[^"'\\\n]|\\.)+          # cut off
      | (?P<scheme>(?i:bearer|basic|token|digest|bot|negotiate|oauth|apikey)[ \t]+)?
        (?:[^\s,;&"'<>{}\[\]()\\]|\\(?![nrt"'\\])
          |&(?!(?:amp;)?[\w.\-\[\]%]*+=))+    # "Tr0ub4dor&3" whole; "abc&next=1" ends before the next parameter
    """,
    re.VERBOSE,
)


def _ending_here(labels: Iterable[str]) -> str:
    """Look-behinds (one per length: a look-behind's alternatives must have one width) for ``labels`` ending here."""
    by_length: dict[int, list[str]] = {}
    for label in labels:
        by_length.setdefault(len(label), []).append(re.escape(label))
    return "|".join(f"(?<={'|'.join(words)})" for _, words in sorted(by_length.items()))


def _after_first_word(last: str, first_words: tuple[str, ...], separators: tuple[str, ...]) -> str:
    """A regex for ``last`` written after one of ``first_words`` (joined to it or after one of ``separators``): ``last``
    then look-behinds, which ``re`` checks only where ``last`` occurs."""
    return f"{last}(?:{_ending_here(first + sep + last for first in first_words for sep in ('', *separators))})"


# The first words of an English code's label ("verification code", "otp_code"; see _PAIR_KEY_WORD, _CODE_OWNERS).
# Not "pin" ("pin code" is a postal code), nor "auth" ("Auth code: 401").
_CODE_FIRST_WORDS = (
    "verification", "verify", "security", "one-time", "onetime", "login", "signin", "sign-in", "access", "sms",
    "two-factor", "2fa", "mfa", "otp",
)  # fmt: skip
# On lower-cased text: every word that can make is_secret_key() (or _code_kind()) true ("apikey" and friends
# through "key"). Written as a trie (first letter, then the rest) because ``re`` tries alternatives one by one.
# Korean key words ("비밀번호: …") too, a key's characters including Hangul syllables, and the first word of a
# two-word label ("API 키", "Access Key", "비밀 번호"; see _PAIR_HEAD): a key is read from its first word on. A code's
# label is found from its last word instead ("code", "코드", "번호": _SECOND_WORDS) where the right word is before it
# ("verification code", "보안 코드", "인증 번호"; not "status code", "오류 코드", "확인 코드", "전화번호"), the word
# before it read too (_first_word_start), so that no common first letter ("v", "l", "o", "보") is a candidate.
_PAIR_KEY_WORD = re.compile(
    r"a(?:uth|ccess[ \t]key|pi[ \t]?(?:key|키))|c(?:ookie|redential|v[vc])|"
    + _after_first_word("code", _CODE_FIRST_WORDS, (" ", "_", "-"))
    + r"|key|p(?:ass|w|rivate[ \t]key|in(?![a-z]))|se(?:cret|ssion)|t(?:oken|p(?<=otp))"  # "otp" from "t": no "o"
    r"|비(?:밀[ \t]?(?:번호|키)|번)|패스워드|암호|시크릿|토큰"
    + "|"
    + _after_first_word("코드", ("인증", "보안", "일회용", "otp"), (" ",))
    + "|"
    + _after_first_word("번호", ("인증", "핀", "otp", "pin"), (" ",))
    # Each branch starts with its literal (no group around the first words): ``re`` then jumps between candidates.
    + r"|인증[ \t]?키|개인[ \t]?키|액세스[ \t]?키|접근[ \t]?키|세션[ \t]?키|서명[ \t]?키|마스터[ \t]?키"
)
_SECOND_WORDS = frozenset({"code", "코드", "번호"})
_CODE_WORDS = _SECOND_WORDS | {"tp", "pin", "cvv", "cvc"}  # the words that find a code's label ("tp": "otp")
# A key whose second word is "code" is judged as a code's label only (_code_kind): "Auth code: 401" is no auth
# secret. A password's label with a confirmation word ("비밀번호 확인") holds the password, or the check's result
# ("비밀번호 확인: 일치", "Password confirm: mismatch"): its value is hidden where it reads as a password.
_CODE_LABEL_KEY = re.compile(r"[ \t](?:[Cc][Oo][Dd][Ee]|코드)\Z")
_CONFIRMATION_KEY = re.compile(r"[ \t](?:확인|재확인|재입력|[Cc]onfirm(?:ation)?)\Z")
# A one-time code's value in text, after its label: "482913", "[482913]", '"482913"', any shape of _CODE_SHAPES,
# then judged by the label's kind.
_ANY_CODE_SHAPE = (
    r"[A-Z]{1,3}-[0-9]{3,10}|[0-9]{3,5}-[0-9]{3,5}|(?=[A-Z]*[0-9])(?=[0-9]*[A-Z])[A-Z0-9]{6,10}|[0-9]{3,10}"
)
# It ends where a particle or a copula is written onto it or after a space ("482913입니다", "[482913]을", "482-913
# 입니다"), or where no word goes on: not before a counter or a unit ("6자리", "300초", "2024년"), nor before a word
# after a space ("OTP 1203 users", "OTP는 2024 도입": what is said about codes), unless that word is the next pair's
# key ("otp=482913 user=kim").
_GLUED_TO_VALUE = r"[을를]|입니|이에요|이예요|예요|이야|이다|이고|이며|이니|이라|라고|임(?![가-힣])|으?로[ \t]"
_CODE_END = rf"(?:(?=[ \t]*(?:{_GLUED_TO_VALUE}))|(?![\w-])(?![ \t]+[^\W_][\w.\-]*+(?![ \t]*[:=])))"
_CODE_IN_TEXT = re.compile(
    rf"(?P<open>\\?[\"'\[「]?)(?P<code>{_ANY_CODE_SHAPE})(?![A-Za-z0-9-])(?:\\?[\"'\]」])?{_CODE_END}"
)
_CODE_AFTER = re.compile(_CODE_END)
# A code given in a Korean sentence: its label, a particle and the code ("인증번호는 482913입니다", "PIN은
# 4821입니다"), or the code in brackets after the label, as a text message writes it ("인증번호 [482913]을
# 입력하세요"). Not a label and a number alone ("OTP 1203 건", "PIN 560001": a count, a postal code), nor "확인 코드"
# (a booking's). Found from the particle or the bracket (few candidates; ``re`` jumps between them), the label
# checked looking back; then (_mask_labelled_code) the label must stand alone (not "안전인증번호") after no
# certification or booking word ("KC 인증번호는 HU07123입니다": _NOT_A_CODE_OWNER), and the code have the digit
# shape of the label's kind.
_PROSE_CODE_LABELS = (
    "OTP",
    "PIN",
    *(
        first + sep + last
        for first, last in (("인증", "번호"), ("인증", "코드"), ("보안", "코드"), ("핀", "번호"), ("OTP", "번호"),
                            ("OTP", "코드"), ("PIN", "번호"))
        for sep in ("", " ")
    ),
)  # fmt: skip
_LABELLED_CODE = re.compile(
    rf"""
    (?:[은는이가](?:{_ending_here(label + particle for label in _PROSE_CODE_LABELS for particle in "은는이가")})[ \t]+
       (?P<open>["'「]?)
     | \[(?:{_ending_here(label + " [" for label in _PROSE_CODE_LABELS)}))
    (?P<code>[A-Z]{{1,3}}-[0-9]{{3,8}}|[0-9]{{3,4}}-[0-9]{{3,4}}|[0-9]{{3,8}})(?![A-Za-z0-9-])[\]"'」]?{_CODE_END}
    """,
    re.VERBOSE,
)
_PROSE_CODE_LABEL_BEFORE = re.compile(
    r"(?:인증[ ]?(?:번호|코드)|보안[ ]?코드|핀[ ]?번호|OTP(?:[ ]?(?:번호|코드))?|PIN(?:[ ]?번호)?)\Z"
)
# A password given in a Korean sentence: "임시 비밀번호는 Xy12!abc 입니다", "비밀번호를 Xy12!abc로 변경했습니다". Not
# "암호" (also a cipher: "암호는 AES-256입니다"). The value must end the sentence or meet a copula, or "(으)로" and a
# verb that sets it: "비밀번호는 ISO-27001 기준을 따릅니다", "비밀번호는 SHA-256으로 해시됩니다" say how a password
# is kept; and it must read as a password (_reads_as_password).
_LABELLED_PASSWORD = re.compile(
    r"""
    (?:비밀[ \t]?번호|비번|패스워드)[은는이가을를][ \t]+
    (?P<open>["'「])?(?(open)|(?=[^\s가-힣"'「」<>]*?[^\sA-Za-z가-힣"'「」<>]))  # bare: not letters alone
    (?P<password>[^\s가-힣"'「」<>]{3,63}?[^\s가-힣"'「」<>.,])(?(open)["'」])
    (?=[ \t]*(?:입니|이에요|이예요|예요|이야|이다|이고|이며|이니|이라|라고|임(?![가-힣]))
      |[ \t]*으?로[ \t]*(?:변경|설정|재설정|초기화|발급|바꾸|바뀌|바꿨|지정|생성|입력)|[을를]
      |[.!?]?[ \t]*(?:\r?\n|\Z)|[.!?]\s)
    """,
    re.VERBOSE,
)
# The same in English: "The password is hunter22.", "Your verification code is 482913". Found from " is" (a
# literal), the label checked looking back. A code must have a code's shape with no word after it ("Your OTP is
# 1203 users"); a password must end the sentence ("The password is SHA-256 hashed.") and read as one
# (_reads_as_password: not "128-bit", "base64-encoded"). Then (_mask_is_credential) the label must follow "your",
# "the" or the like (_GIVEN_TO_SOMEONE: "Number of users without a PIN is 120" counts users).
_IS_PASSWORD_LABELS = ("password", "passphrase", "passcode")
_IS_CODE_LABELS = (
    "otp",
    "totp",
    *(
        first + sep + "code"
        for first in ("verification", "security", "login", "sign-in", "sign in", "signin", "one-time", "one time",
                      "onetime", "2fa", "mfa", "otp", "sms", "access")
        for sep in (" ", "-")
    ),
)  # fmt: skip
_IS_CREDENTIAL = re.compile(
    rf"""
    \ is
    (?:(?P<password_label>(?i:{_ending_here(label + " is" for label in _IS_PASSWORD_LABELS)}))
     | (?P<code_label>(?i:{_ending_here(label + " is" for label in _IS_CODE_LABELS)})|(?<=PIN\ is)))
    [ \t]+
    (?(code_label)
      ["'`]?(?P<code>[A-Z]{{1,3}}-[0-9]{{4,8}}|[0-9]{{3,4}}-[0-9]{{3,4}}|[0-9]{{4,8}})(?![A-Za-z0-9-])["'`]?{_CODE_END}
    | (?P<open>["'`])?(?(open)|(?=[^\s"'`<>]*?[^\sA-Za-z"'`<>]))  # bare: not letters alone
      (?P<password>[^\s"'`<>]{{3,127}}?[^\s"'`<>.,])
      (?(open)(?P=open)(?=[.,]?(?:\s|\Z))|(?=[.!?]?[ \t]*(?:\r?\n|\Z)|[.!?]\s)))
    """,
    re.VERBOSE,
)
_IS_LABEL_BEFORE = re.compile(r"(?<![\w-])(?:(?i:pass(?:word|phrase|code)|(?:[\w-]+[ -])?code|t?otp)|(?P<pin>PIN))\Z")
_IS_LABEL_BEFORE_CHARS = 24  # "verification code" and some room
_GIVEN_TO_SOMEONE = re.compile(
    r"(?<![\w-])(?i:your|the|my|our|new|temporary|temp|default|initial|current)[ \t]+(?:[\w-]+[ \t]+){0,2}\Z"
)
_GIVEN_TO_SOMEONE_CHARS = 64
# "482913 is your verification code", "G-482913 is your Google verification code" (as text messages write it).
_CODE_IS_YOURS = re.compile(
    r"""
    (?<![\w-])(?P<code>[A-Z]{1,3}-[0-9]{4,8}|[0-9]{3,4}-[0-9]{3,4}|[0-9]{4,8})(?![A-Za-z0-9-])
    [ \t]+is[ \t]+your[ \t]+(?:[\w-]+[ \t]+){0,2}?
    (?:(?P<one_time>(?i:(?:verification|security|login|sign[- ]in|authentication|one[- ]time|2fa|mfa|access)[ -]code
                      |one[- ]time[ -]pass(?:word|code)|passcode|otp))|PIN)(?![A-Za-z])
    """,
    re.VERBOSE,
)
# Words or numbers joined by "-" (what is said about a password: "SHA-256", "128-bit", "base64-encoded",
# "2FA-protected", "8-64", "2024-05-17"), and a percentage.
_DESCRIBING_WORDS = re.compile(r"[A-Za-z0-9]+(?:-[A-Za-z0-9]+)+|[0-9.]+%")
_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") | frozenset(
    map(chr, range(0xAC00, 0xD7A4))
)
_KEY_RUN = re.compile(r"[A-Za-z0-9_.\-가-힣]*")
_MAX_KEY_CHARS = 200
_COOKIE_VALUE_END = re.compile(r"[\r\n\"'\\]|\Z")  # a cookie header value runs to the end of its line
_NOT_A_SECRET_VALUE = frozenset({"null", "none", "true", "false", "nil", "undefined", MASK})
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")

# Short texts are gated by one regex instead of a dozen ``in`` checks.
_SHORT_TEXT = 256
_MAYBE_SENSITIVE = re.compile(  # literal-first branches only, so ``re`` skips other characters quickly
    r":|=|：|＝|@|-----BEGIN|eyJ|A(?:KIA|SIA|Iza)|sk[-_]|rk_|whsec_|xox|gh[pousr]_|github_pat_|glpat-|apk_"
    r"|B(?:earer|EARER|asic|ASIC)|b(?:earer|asic)"
    r"|%3|</|-[-p]|\"[ \t]*,|'[ \t]*,"  # URL-encoded pairs, XML elements, command-line options, (name, value) pairs
    r"|번호|코드|비번|패스워드|OTP|PIN| is "  # a credential given in a sentence (_LABELLED_CODE, _IS_CREDENTIAL)
)


def _mask_pem(match: re.Match[str]) -> str:
    return match["begin"] + MASK + match["end"]


def _mask_query_parameter(match: re.Match[str]) -> str:
    if match["value"] == MASK:
        return match[0]
    name = _KEY_SEPARATORS.sub("", match["name"].lower())
    if name in _SECRET_QUERY_NAMES or "signature" in name or is_secret_key(match["name"]):
        return match["head"] + MASK
    return match[0]


def _mask_auth_credential(match: re.Match[str]) -> str:
    credential = match["credential"]
    if match["scheme"].lower() == "basic":
        if not _is_basic_credential(credential):
            return match[0]  # "basic information": prose, not a credential
    elif len(credential) < 8 and not _NOT_ONLY_LETTERS.search(credential):
        return match[0]  # "Bearer token": prose, not a credential
    return match["head"] + MASK


def _mask_encoded_pairs(text: str) -> str:
    """Mask the values of URL-encoded secret pairs (:data:`_ENCODED_SEPARATOR`)."""
    pieces: list[str] = []
    done = position = 0
    while (separator := _ENCODED_SEPARATOR.search(text, position)) is not None:
        position = separator.end()
        key_start = key_end = separator.start()
        floor = max(done, key_end - _MAX_KEY_CHARS)
        while key_start > floor and text[key_start - 1] in _ENCODED_KEY_CHARS:
            key_start -= 1
        if key_start > 0 and text[key_start - 1] == "%":
            key_start += 2  # "%26password%3D…": the key starts after the escape's two hex digits
        if key_start >= key_end or not is_secret_key(text[key_start:key_end]):
            continue
        value = _ENCODED_VALUE.match(text, position)
        if value is None or value[0] == MASK or value[0].lower() in _NOT_A_SECRET_VALUE:
            continue
        pieces.append(text[done:position])
        pieces.append(MASK)
        done = position = value.end()
    if not pieces:
        return text
    pieces.append(text[done:])
    return "".join(pieces)


def _mask_xml_element(match: re.Match[str]) -> str:
    value = match["value"].strip()
    if not value or value.lower() in _NOT_A_SECRET_VALUE or not is_secret_key(match["name"]):
        return match[0]
    return match.string[match.start() : match.start("value")] + MASK + f"</{match['name']}>"


def _mask_secret_option(match: re.Match[str]) -> str:
    value, name = match["value"], match["name"]
    quote = value[0] if value[0] in "\"'" else ""
    inner = value[1:-1] if quote else value
    if (
        not inner
        or inner.lower() in _NOT_A_SECRET_VALUE
        or inner.lower().rstrip(".,:!?") in _PROSE_AFTER_OPTION
        or _NOT_A_VALUE_OPTION.match("--" + name)
        or not is_secret_key(name)
    ):
        return match[0]
    return match.string[match.start() : match.start("value")] + quote + MASK + quote


def _mask_password_option(match: re.Match[str]) -> str:
    if match["value"] == MASK:
        return match[0]
    return match.string[match.start() : match.start("value")] + MASK


def _mask_labelled_code(match: re.Match[str]) -> str:
    """A match of :data:`_LABELLED_CODE` with its code masked where the label stands alone, after no certification
    or booking word, and the code has the shape of the label's kind."""
    text, start = match.string, match.start()
    label_end = start if match["open"] is not None else start - 1  # "인증번호는 …", "인증번호 […"
    label = _PROSE_CODE_LABEL_BEFORE.search(text, max(0, label_end - 8), label_end)
    if label is None:
        return match[0]
    kind: CodeKind = "security" if label[0][0] == "보" else "pin" if label[0][0] in "핀P" else "one_time"
    label_start = label.start()
    if (
        (label_start > 0 and (text[label_start - 1].isalnum() or text[label_start - 1] == "_"))  # "안전인증번호"
        or _word_before(text, label_start) in _NOT_A_CODE_OWNER
        or _CODE_SHAPES[kind].fullmatch(match["code"]) is None
    ):
        return match[0]
    return text[start : match.start("code")] + MASK + text[match.end("code") : match.end()]


def _mask_labelled_password(match: re.Match[str]) -> str:
    """A match of :data:`_LABELLED_PASSWORD` with its password masked where it reads as one."""
    if not _reads_as_password(match["password"], quoted=bool(match["open"])):
        return match[0]
    text, start = match.string, match.start()
    return text[start : match.start("password")] + MASK + text[match.end("password") : match.end()]


def _mask_is_credential(match: re.Match[str]) -> str:
    """A match of :data:`_IS_CREDENTIAL` with its value masked where the label stands alone and is given to someone
    ("Your …", "The …"), and the value reads as a credential of the label's kind."""
    text, start = match.string, match.start()
    label = _IS_LABEL_BEFORE.search(text, max(0, start - _IS_LABEL_BEFORE_CHARS), start)
    if (
        label is None
        or _GIVEN_TO_SOMEONE.search(text, max(0, label.start() - _GIVEN_TO_SOMEONE_CHARS), label.start()) is None
    ):
        return match[0]
    if match["code"] is not None:
        group = "code"
        kind: CodeKind = "pin" if label["pin"] else "security" if label[0][:3].lower() == "sec" else "one_time"
        if _CODE_SHAPES[kind].fullmatch(match["code"]) is None:
            return match[0]
    else:
        group = "password"
        if not _reads_as_password(match["password"], quoted=bool(match["open"])):
            return match[0]
    return text[start : match.start(group)] + MASK + text[match.end(group) : match.end()]


def _mask_code_is_yours(match: re.Match[str]) -> str:
    code = match["code"]
    if match["one_time"] is None and _CODE_SHAPES["pin"].fullmatch(code) is None:  # "560001 is your PIN"
        return match[0]
    return MASK + match[0][len(code) :]


def _reads_as_password(value: str, *, quoted: bool) -> bool:
    """Whether ``value``, given after a password's label in a sentence (or a confirmation label's value), is the
    password: not a word, nor words or numbers joined by ``-`` (``bcrypt``, ``required``, ``case-sensitive``,
    ``SHA-256``, ``128-bit``, ``base64-encoded``: what is said about it), nor a percentage, unless quoted
    (``'admin'``); nor shorter than :data:`MIN_SECRET_LENGTH`, nor already masked."""
    if len(value) < MIN_SECRET_LENGTH or value.lower() in _NOT_A_SECRET_VALUE or MASK in value:
        return False
    return quoted or not (value.isalpha() or _DESCRIBING_WORDS.fullmatch(value) is not None)


def _masked_code_value(text: str, start: int, kind: CodeKind) -> tuple[str | None, int]:
    """The masked replacement of a ``kind`` code's value at ``start`` (its opening quote kept; None: no code there,
    ``"OTP: disabled"``, ``"PIN: 560001"``, ``"OTP: 1203 users"``) and where the replaced span ends."""
    found = _CODE_IN_TEXT.match(text, start)
    if found is None or _CODE_SHAPES[kind].fullmatch(found["code"]) is None:
        return None, start
    return found["open"] + MASK, found.end("code")


def _holds_password(value: str) -> bool:
    """Whether a pair's raw value (quoted or not) reads as a password (:func:`_reads_as_password`)."""
    quote = value[:2] if value[:2] == '\\"' else value[:1] if value[:1] in "\"'" else ""
    inner = value[len(quote) :]
    if quote and inner.endswith(quote):
        inner = inner[: -len(quote)]
    return _reads_as_password(inner, quoted=bool(quote))


def _word_before(text: str, start: int) -> str:
    """The word (lower-cased) before ``text[start]`` with spaces between them ("KC 인증번호" -> "kc"); "" where none."""
    end = start
    while end > 0 and text[end - 1] in " \t":
        end -= 1
    begin = end
    while begin > max(0, end - 32) and text[begin - 1] in _KEY_CHARS:
        begin -= 1
    return text[begin:end].lower() if end < start else ""


def _mask_named_values(text: str, pattern: re.Pattern[str], *, pair: bool) -> str:
    """Mask the value after each ``pattern`` match whose name names a secret: ``pair``, the second item of a pair
    (the name is the match's, and a ``]`` or ``)`` must close the value); else a value field (the name is the
    name field just before the match)."""
    pieces: list[str] = []
    done = position = 0
    while (head := pattern.search(text, position)) is not None:
        position = head.end()
        if pair:
            name = head["name"]
        else:
            start = head.start()
            before = _NAME_FIELD_BEFORE_REVERSED.match(text[max(done, start - _NAME_FIELD_BEFORE_CHARS) : start][::-1])
            if before is None:
                continue
            name = before["name"][::-1]
        if not _is_secret_name(name):
            continue
        value = _PAIR_VALUE.match(text, position)
        if value is None or (pair and _PAIR_TEXT_END.match(text, value.end()) is None):
            continue
        if pair and _are_variable_names(name, value[0].strip("\\\"'")):  # '["API_TOKEN", "DB_PASSWORD"]': two names
            continue
        masked, value_end = _masked_pair_value(value, name, text)
        if masked is not None:
            pieces.append(text[done:position])
            pieces.append(masked)
            done = position = value_end
    if not pieces:
        return text
    pieces.append(text[done:])
    return "".join(pieces)


def _is_basic_credential(credential: str) -> bool:
    """Whether ``credential`` is base64 of ``user:password`` (what HTTP Basic sends)."""
    body = credential.rstrip("=").translate(_URLSAFE_TO_STANDARD)
    try:
        return b":" in base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
    except (binascii.Error, ValueError):
        return False


def _mask_secret_pairs(text: str) -> str:
    """Mask the values of secret ``key=value`` / ``key: value`` pairs.

    Only positions where a secret-ish word occurs are examined (found in a lower-cased copy, so the scan
    is one fast regex pass). When a candidate key is not secret (``max_tokens``, ``author``) scanning goes
    on inside its value, so a pair nested there is still found. Linear in the length of the text.
    """
    lowered = text.lower()
    if len(lowered) != len(text):  # a few characters lower-case to two: keep offsets aligned
        lowered = text.translate(_ASCII_LOWER)
    pieces: list[str] = []
    done = 0  # text[:done] is already in pieces
    position = 0
    while (word := _PAIR_KEY_WORD.search(lowered, position)) is not None:
        key_start = word.start()
        floor = max(0, key_start - _MAX_KEY_CHARS, done)
        while key_start > floor and text[key_start - 1] in _KEY_CHARS:
            key_start -= 1
        if key_start == word.start() and word[0] in _SECOND_WORDS:  # "verification code", "보안 코드"
            key_start = _first_word_start(text, key_start, floor)
        head = None
        for start in (key_start - 2, key_start - 1, key_start):  # \"key\", "key", key
            if start >= done and (start == key_start or text[start] in "\\\"'"):
                head = _PAIR_HEAD.match(text, start)
                if head is not None:
                    break
        if head is None:  # no separator after this word: skip the rest of it
            run = _KEY_RUN.match(text, word.end())  # never None: the pattern matches the empty string
            position = max(run.end() if run is not None else 0, word.end())
            continue
        position = max(head.end(), word.end())
        key = head["key"]
        if _CODE_LABEL_KEY.search(key) is None and is_secret_key(key):
            value = _PAIR_VALUE.match(text, head.end())
            if value is None or (_CONFIRMATION_KEY.search(key) is not None and not _holds_password(value[0])):
                continue  # "비밀번호 확인: 일치": the check's result
            masked, value_end = _masked_pair_value(value, key, text)
        elif word[0] in _CODE_WORDS and (kind := _code_kind(key)) is not None:
            # "인증번호: 482913", "OTP=482913"; not "OTP: disabled", "PIN: 560001", "KC 인증번호: R-1203"
            masked, value_end = _masked_code_value(text, head.end(), kind)
            if masked is not None and _word_before(text, head.start("key")) in _NOT_A_CODE_OWNER:
                continue
        else:
            continue  # go on inside the value
        if masked is not None:
            pieces.append(text[done : head.end()])
            pieces.append(masked)
            done = position = value_end
    if not pieces:
        return text
    pieces.append(text[done:])
    return "".join(pieces)


def _first_word_start(text: str, start: int, floor: int) -> int:
    """Where the word before a label's last word (:data:`_SECOND_WORDS`, at ``start``) starts, when one space apart
    from it, not before ``floor`` ("verification code", "보안 코드": _PAIR_HEAD reads both); else ``start``."""
    if start - 2 < floor or text[start - 1] not in " \t" or text[start - 2] not in _KEY_CHARS:
        return start
    start -= 1
    while start > floor and text[start - 1] in _KEY_CHARS:
        start -= 1
    return start


def _masked_pair_value(value: re.Match[str], key: str, text: str) -> tuple[str | None, int]:
    """The masked replacement of a secret pair's value (None: leave it) and where the replaced span ends."""
    raw, end = value[0], value.end()
    if raw[:2] == '\\"':
        opening = '\\"'
        closing = opening if len(raw) >= 4 and raw.endswith(opening) else ""
        inner = raw[2 : len(raw) - len(closing)]
    elif raw[0] in "\"'":
        opening = raw[0]
        closing = opening if len(raw) >= 2 and raw[-1] == opening else ""
        inner = raw[1 : len(raw) - len(closing)]
    else:
        opening, closing = value["scheme"] or "", ""
        inner = raw[len(opening) :]
        if "cookie" in key.lower():  # "Cookie: a=1; b=2": every cookie, to the end of the line
            cookie_end = _COOKIE_VALUE_END.search(text, value.start())
            end = max(end, cookie_end.start() if cookie_end else len(text))
    if not inner or inner.lower() in _NOT_A_SECRET_VALUE:
        return None, end
    return opening + MASK + closing, end


def _mask_patterns(text: str) -> str:
    """Apply every value pattern; ``text`` already has its known secrets masked."""
    if "PRIVATE KEY" in text:
        text = _PEM_PRIVATE_KEY.sub(_mask_pem, text)
    if "eyJ" in text:
        text = _JWT.sub(MASK, text)
    if "AKIA" in text or "ASIA" in text:
        text = _AWS_ACCESS_KEY_ID.sub(MASK, text)
    if _API_KEY_PREFIX.search(text) is not None:
        text = _API_KEY_SHAPES.sub(MASK, text)
    if "://" in text and "@" in text:
        text = _URL_USERINFO.sub(r"\g<head>" + MASK, text)
    has_equals = "=" in text
    has_separator = has_equals or ":" in text
    if not has_separator and not text.isascii():  # "비밀번호：…": a pair with a full-width separator
        has_separator = "：" in text or "＝" in text
    if has_equals and ("?" in text or "&" in text):
        text = _QUERY_PARAMETER.sub(_mask_query_parameter, text)
    if has_separator and ("ecret" in text or "ECRET" in text):
        text = _AWS_SECRET_LABELLED.sub(r"\g<head>" + MASK, text)
    if "earer" in text or "EARER" in text or "asic" in text or "ASIC" in text:
        text = _AUTH_SCHEME_CREDENTIAL.sub(_mask_auth_credential, text)
    if "%3" in text:
        text = _mask_encoded_pairs(text)
    if "</" in text:
        text = _XML_ELEMENT.sub(_mask_xml_element, text)
    if "--" in text:
        text = _SECRET_OPTION.sub(_mask_secret_option, text)
    if "-p" in text and ("mysql" in text or "mariadb" in text or "sshpass" in text):
        text = _PASSWORD_OPTION.sub(_mask_password_option, text)
    if has_separator and ("alue" in text or "ALUE" in text or "val" in text or "ontent" in text or "ecret" in text):
        text = _mask_named_values(text, _VALUE_FIELD_TEXT, pair=False)
    if "," in text and any(opening in text for opening in _PAIR_TEXT_OPENINGS):
        text = _mask_named_values(text, _PAIR_TEXT, pair=True)
    if has_separator:
        text = _mask_secret_pairs(text)
    # After the pairs ("인증번호: 482913" is one already), each where its label's words occur.
    has_code_label = "OTP" in text or "PIN" in text
    if has_code_label or (not text.isascii() and ("번호" in text or "코드" in text)):
        text = _LABELLED_CODE.sub(_mask_labelled_code, text)
    if not text.isascii() and ("비밀" in text or "비번" in text or "패스워드" in text):
        text = _LABELLED_PASSWORD.sub(_mask_labelled_password, text)
    if " is " in text:
        if has_code_label or "ass" in text or "ASS" in text or "ode" in text or "ODE" in text or "tp" in text:
            text = _IS_CREDENTIAL.sub(_mask_is_credential, text)
        if " is your " in text:
            text = _CODE_IS_YOURS.sub(_mask_code_is_yours, text)
    return text


def storable_text(text: str) -> str:
    """``text`` with NUL characters and unpaired surrogates replaced by U+FFFD (see the module docstring)."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate; a split pair is joined again
            text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


# A run of URL text holding percent escapes: what a secret percent-encoded in any mix (``%72v%54o%6B…``, upper- and
# lower-case hex) stands in. Decoded, it is looked at for the secrets (``_percent_encoded_secrets``).
_PERCENT_RUN = re.compile(r"[A-Za-z0-9._~+-]*(?:%[0-9A-Fa-f]{2}[A-Za-z0-9._~+-]*){2,}")


def _percent_encoded_secrets(text: str, matcher: _SecretMatcher) -> str:
    """``text`` with each run of percent-encoded URL text that holds a secret once decoded masked whole: the forms
    the matcher knows are the whole secret encoded in one case; a tool may encode some bytes and not others."""

    def masked(run: re.Match[str]) -> str:
        decoded = unquote(run[0])
        return MASK if decoded != run[0] and matcher.sub(decoded) != decoded else run[0]

    return _PERCENT_RUN.sub(masked, text)


def _known_secrets_masked(text: str, matcher: _SecretMatcher) -> str:
    """``text`` with the known secrets masked in the forms the matcher knows, and in percent-encoded URL text."""
    text = matcher.sub(text)
    return _percent_encoded_secrets(text, matcher) if "%" in text else text


def _mask_str(text: str, matcher: _SecretMatcher | None) -> str:
    # The secrets first, then what no database stores: a NUL between a secret's letters is a hidden character
    # there (masked with the secret); made U+FFFD first, it split the secret and left it in clear.
    if matcher is not None:
        text = _known_secrets_masked(text, matcher)
    text = storable_text(text)
    if len(text) <= _SHORT_TEXT and _MAYBE_SENSITIVE.search(text) is None:
        return text
    text = _mask_patterns(text)
    if matcher is not None and matcher.recheck:
        text = matcher.sub(text)
    return text


def mask_text(text: object, *, secrets: Iterable[str] = ()) -> str:
    """``text`` with every secret replaced by :data:`MASK`; everything else (any language) kept as is.

    Masks the exact ``secrets`` given plus every registered secret (and their base64, URL-encoded and
    JSON-escaped forms; longest first; values under :data:`MIN_SECRET_LENGTH` characters ignored), then the
    value patterns and secret ``key=value`` pairs described in the module docstring. ``Bearer``/``Basic``
    keep the scheme word, URLs keep the user name, pairs keep the key and quotes: only the secret is replaced.

    ``secrets`` may be any iterable of strings; one ``str`` counts as one secret and a mapping as its values.
    A non-``str`` ``text`` is converted with ``str()`` first. Idempotent in practice: masked text stays masked.
    """
    return _mask_str(text if isinstance(text, str) else str(text), _resolve_matcher(secrets))


# --- internal locations ---------------------------------------------------------------------------------

INTERNAL_ADDRESS = "[internal address]"
"""What replaces a private or loopback address (with its port) in an exception's message."""

INTERNAL_PATH = "[path]"
"""What replaces an absolute file path (with the line it names) in an exception's message."""

# An IPv4 address (with its port), a bracketed IPv6 one, a bare IPv6 one (judged by ``ipaddress``: a time such as
# 12:30:45 is none), ``localhost``, or a host name of a private network (``postgres-primary.svc.cluster.local``,
# ``hr.corp.local:8080``, ``ledger.internal``: ending .local, .internal, .svc, .corp or .lan); not part of a longer
# word, number or path (a version 1.2.3.4.5, a public name ``docs.internal.example.com``, ``/etc/app/settings.local``).
_ADDRESS = re.compile(
    r"(?<![\w.])(?P<v4>[0-9]{1,3}(?:\.[0-9]{1,3}){3})(?::[0-9]{1,5})?(?!\w|\.[0-9])"
    r"|\[(?P<v6>[0-9A-Fa-f:.]+)(?:%[\w.-]+)?\](?::[0-9]{1,5})?"
    r"|(?<![\w:.])(?P<bare>(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4})(?![\w:])"
    r"|(?<![\w.-])(?P<name>localhost)(?::[0-9]{1,5})?(?![\w-])"
    r"|(?:(?<=//)|(?<![\w./\\-]))(?P<host>(?:[A-Za-z0-9-]+\.)+(?i:local|internal|svc|corp|lan))(?::[0-9]{1,5})?"
    r"(?![\w-]|\.\w)"
)
# An absolute file path of two parts or more (POSIX, from the home directory, a file URL, or Windows), with the line
# it names after it (``/srv/app/db.py line 42``, ``"/srv/app/db.py", line 42``: a traceback's, the quote kept;
# ``/srv/app/db.py:42``). Not a relative path or a URL's path (``a/b``, ``https://host/a/b``: the character before
# it is a word's, a ``:`` or a ``/``), nor a division (``1 / 2``).
_PATH_PART = r"(?:\.{1,2}|\.?[\w@+-]+(?:\.[\w@+-]+)*)"
_FILE_PATH = re.compile(
    rf"(?:file://|(?<![\w/:.\])\]~])~?)/{_PATH_PART}(?:/{_PATH_PART})+/?"
    rf"|(?<![\w/\\])[A-Za-z]:\\(?:[^\\\s\"'<>|:*?]+\\)*[^\\\s\"'<>|:*?;,]+"
    rf"|(?<![\w\\:])\\\\[\w.$-]+(?:\\[^\\\s\"'<>|:*?]+)*\\[^\\\s\"'<>|:*?;,]+"
)
# A path that opens a quoted span runs to the span's closing mark on its line (``'/srv/데이터/설정 파일.yaml'``,
# ``"C:\Program Files\app.ini"``): its parts may hold spaces.
_CLOSING_QUOTE = {"'": "'", '"': '"', "`": "`", "\u201c": "\u201d", "\u2018": "\u2019"}
_QUOTED_PATH_MAX = 400
_LINE_AFTER_PATH = re.compile(r"(?P<quote>[\"']?)(?:,?[ \t]*line[ \t]+[0-9]+|(?::[0-9]+){1,2}(?![\w.]))")


def _internal_address(match: re.Match[str]) -> str:
    if match["name"] or match["host"]:
        return INTERNAL_ADDRESS
    try:
        address = ipaddress.ip_address(match["v4"] or match["v6"] or match["bare"])
    except ValueError:
        return match[0]
    internal = address.is_private or address.is_loopback or address.is_link_local or address.is_unspecified
    return INTERNAL_ADDRESS if internal else match[0]


def mask_internal_locations(text: str) -> str:
    """``text`` (an exception's message) without where the code behind it runs: private, loopback and link-local
    addresses and private networks' host names with their ports (``10.0.3.17:5432``, ``[::1]:8000``,
    ``localhost:5432``, ``db.svc.cluster.local``) as :data:`INTERNAL_ADDRESS`, absolute file paths with the line they
    name (``/srv/app/db.py line 42``, ``C:\\app\\db.py``, ``\\\\fileserver\\hr\\x.xlsx``; a quoted one to its closing
    quote) as :data:`INTERNAL_PATH`. A public address, a relative path, a URL's path and a "line 3" that names no
    file stay: they may be what the message is about. Secrets are :func:`mask_text`'s."""
    text = _ADDRESS.sub(_internal_address, text)
    parts: list[str] = []
    copied = 0
    for path in _FILE_PATH.finditer(text):
        if path.start() < copied:
            continue  # inside the quoted path before it
        parts.append(text[copied : path.start()])
        parts.append(INTERNAL_PATH)
        copied = path.end()
        closing = _CLOSING_QUOTE.get(text[path.start() - 1]) if path.start() else None
        if closing is not None:
            end = text.find(closing, copied, path.start() + _QUOTED_PATH_MAX)
            if end != -1 and "\n" not in text[copied:end]:
                copied = end
        line = _LINE_AFTER_PATH.match(text, copied)
        if line is not None:
            parts.append(line["quote"])
            copied = line.end()
    parts.append(text[copied:])
    return "".join(parts)


def mask_known(value: Any, *, secrets: Iterable[str] = ()) -> Any:
    """A copy of ``value`` (dicts, lists, strings; anything else as it is) in which every string has the known
    secrets (``secrets`` and the registered ones, in the forms :func:`mask_text` finds) replaced by :data:`MASK`,
    and nothing else: no key-name or value-pattern masking, so a structure with a meaning of its own (a tool's
    input schema, whose property may be called ``api_key``) keeps its shape. Dict keys are kept."""
    matcher = _resolve_matcher(secrets)
    if matcher is None:
        return value

    def walk(item: Any) -> Any:
        if isinstance(item, str):
            return _known_secrets_masked(item, matcher)
        if isinstance(item, dict):
            return {key: walk(child) for key, child in item.items()}
        if isinstance(item, list):
            return [walk(child) for child in item]
        return item

    return walk(value)


# --- structures ----------------------------------------------------------------------------------------------

_UNCHANGED_SCALARS = (
    int,
    float,
    complex,
    decimal.Decimal,
    _dt.date,
    _dt.time,
    _dt.timedelta,
    uuid.UUID,
    enum.Enum,
    type(None),
)
_MEMO_MAX_CHARS = 256  # short strings (keys, enum-like values) repeat a lot in large results


def _is_empty(value: Any) -> bool:
    return value is None or (isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)) and not value)


class _Memos:
    """What short texts and dict keys mask to under one matcher (one set of secrets): the same whatever structure
    they appear in, so kept across calls (a run masks its rule names, tool names and keys many times over). A
    changed set of secrets is another matcher with its own memos. Bounded: emptied when full."""

    __slots__ = ("keys", "texts")

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}  # short text -> masked text
        # dict key -> (masked key, names a secret, the kind of one-time code it names)
        self.keys: dict[str, tuple[str, bool, CodeKind | None]] = {}


_MEMO_MAX_ENTRIES = 4096
_NO_SECRET_MEMOS = _Memos()  # the memos where no secret is known (only the value patterns apply)


class _Walker:
    """Masks one structure: an iterative deep copy (no recursion limit), sharing one matcher and its memos."""

    def __init__(self, matcher: _SecretMatcher | None) -> None:
        self.matcher = matcher
        memos = matcher.memos if matcher is not None else _NO_SECRET_MEMOS
        if len(memos.texts) > _MEMO_MAX_ENTRIES or len(memos.keys) > _MEMO_MAX_ENTRIES:
            memos.texts.clear()  # a dict's own operations are atomic: another thread sees it whole or empty
            memos.keys.clear()
        self.memo = memos.texts
        self.keys = memos.keys
        self.numbers = matcher.numbers if matcher is not None else frozenset()

    def text(self, text: str) -> str:
        if len(text) > _MEMO_MAX_CHARS:
            return _mask_str(text, self.matcher)
        masked = self.memo.get(text)
        if masked is None:
            masked = self.memo[text] = _mask_str(text, self.matcher)
        return masked

    def leaf(self, value: Any) -> Any:
        """A masked copy of a non-container value."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)  # NaN and infinities: no JSON column stores them (as text: "nan", "inf")
        if self.numbers and _secret_number(value, self.numbers):
            return MASK
        if isinstance(value, _UNCHANGED_SCALARS):  # bool is an int
            return value
        if isinstance(value, (bytes, bytearray)):
            masked = self.text(bytes(value).decode("utf-8", "surrogateescape"))
            return type(value)(masked.encode("utf-8", "surrogateescape"))
        dump = getattr(value, "model_dump", None)  # pydantic models (MCP result objects)
        if callable(dump):
            with contextlib.suppress(Exception):  # a failing dump falls back to the text form below
                return self.walk(dump(mode="json"))
        return self.text(str(value))  # unknown object: fail closed, keep only its masked text

    def key(self, key: Any) -> tuple[Any, bool, CodeKind | None]:
        """The masked form of a dict key, whether it names a secret, and the kind of one-time code it names (whose
        value is hidden where it has that code's shape: :func:`_is_code_value`)."""
        if isinstance(key, str):
            known = self.keys.get(key)
            if known is None:
                known = self.keys[key] = (self.text(key), is_secret_key(key), _code_kind(key))
            return known
        return (key if isinstance(key, _UNCHANGED_SCALARS) else self.walk(key)), False, None

    def pair(self, pair: tuple[Any, ...] | list[Any]) -> Any:
        """A masked copy of a ``(name, value)`` pair whose name names a secret: the name, and :data:`MASK`."""
        items = [self.text(pair[0]), MASK]
        return items if isinstance(pair, list) else _rebuild(pair, items)

    def unique_key(self, key: Any, taken: dict[Any, Any]) -> Any:
        """``key``, or a numbered variant when two keys masked to the same text (both entries are kept)."""
        number, candidate = 2, key
        while candidate in taken:
            candidate = self.text(f"{key}~{number}")
            number += 1
        return candidate

    def walk(self, value: Any) -> Any:
        if not isinstance(value, _CONTAINERS):
            return self.leaf(value)
        if type(value) is tuple and len(value) == 2 and _is_secret_pair(value):
            return self.pair(value)
        memo, keys, numbers = self.memo, self.keys, self.numbers
        root: list[Any] = [None]
        # Stack items: (source, parent, slot) to copy source into parent[slot], or (source, copy, parent, slot)
        # once source's children are done (on_path bookkeeping, tuple/set rebuilding).
        stack: list[tuple[Any, ...]] = [(value, root, 0)]
        on_path: set[int] = set()  # ids of the containers being copied: a cycle is cut, not followed
        while stack:
            item = stack.pop()
            if len(item) == 4:
                source, copy, parent, slot = item
                on_path.discard(id(source))
                if type(slot) is str and isinstance(source, list) and slot.lower() in _COMMAND_LINE_KEYS:
                    # A command line, or a change's [old, new] pair of them: its items are masked by now.
                    for line in (copy, *(inner for inner in copy if isinstance(inner, list))):
                        _mask_option_values(line)
                if not isinstance(source, (dict, list)):
                    parent[slot] = _rebuild(source, copy)
                continue
            source, parent, slot = item
            if id(source) in on_path:
                parent[slot] = "<cycle>"
                continue
            on_path.add(id(source))
            if isinstance(source, dict):
                copy = {}
                parent[slot] = copy
                stack.append((source, copy, parent, slot))
                # {"name": "Authorization", "value": ...}: the value fields beside a name field naming a secret.
                hidden = (
                    _named_secret_values(source)
                    if len(source) <= _NAMED_VALUE_MAX_FIELDS and not _VALUE_FIELDS.isdisjoint(source)
                    else None
                )
                for key, child in source.items():
                    known = keys.get(key) if type(key) is str else None
                    new_key, secret, code = known if known is not None else self.key(key)
                    if new_key in copy:
                        new_key = self.unique_key(new_key, copy)
                    if (
                        (secret or (hidden is not None and key in hidden))
                        and not _is_empty(child)
                        and not (secret and _is_token_count(key, child))
                    ) or (code is not None and _is_code_value(child, code)):
                        copy[new_key] = MASK
                    elif type(child) is str:
                        masked = memo.get(child)
                        copy[new_key] = masked if masked is not None else self.text(child)
                    elif child is None or type(child) in _PLAIN_SCALARS:
                        # A finite float as it is; NaN and infinities through leaf (x - x is 0 for finite x only).
                        if numbers and _secret_number(child, numbers):
                            copy[new_key] = MASK
                        else:
                            copy[new_key] = (
                                child if type(child) is not float or child - child == 0 else self.leaf(child)
                            )
                    elif type(child) is tuple and len(child) == 2 and _is_secret_pair(child):
                        copy[new_key] = self.pair(child)  # ("X-Api-Key", "...")
                    elif isinstance(child, _CONTAINERS):
                        copy[new_key] = None
                        stack.append((child, copy, new_key))
                    else:
                        copy[new_key] = self.leaf(child)
            else:
                copy = [None] * len(source)
                if isinstance(source, list):
                    parent[slot] = copy
                stack.append((source, copy, parent, slot))
                for index, child in enumerate(source):
                    if type(child) is str:
                        masked = memo.get(child)
                        copy[index] = masked if masked is not None else self.text(child)
                    elif child is None or type(child) in _PLAIN_SCALARS:
                        if numbers and _secret_number(child, numbers):
                            copy[index] = MASK
                        else:
                            copy[index] = child if type(child) is not float or child - child == 0 else self.leaf(child)
                    elif isinstance(child, (list, tuple)) and len(child) == 2 and _is_secret_pair(child):
                        copy[index] = self.pair(child)  # a header list: [["X-Api-Key", "..."], ...]
                    elif isinstance(child, _CONTAINERS):
                        stack.append((child, copy, index))
                    else:
                        copy[index] = self.leaf(child)
        return root[0]


_CONTAINERS = (dict, list, tuple, set, frozenset)

# A key that counts tokens rather than holding one: LangChain's ``input_token_details`` /
# ``output_token_details`` (``{"cache_read": 40}``), a provider's ``cached_tokens``. Matched on the lower-cased key
# with its separators removed; a secret word before it ("access_tokens") is judged by its value (see below).
_TOKEN_COUNT_KEY = re.compile(r"tokens\Z|tokens?details?\Z")


def _is_token_count(key: Any, value: Any) -> bool:
    """Whether ``value`` under the secret-looking ``key`` is a token count, not a token: the key ends in ``tokens``
    or ``token_details`` (not ``token``: ``{"token": 123456}`` stays masked) and the value is a number, or a dict of
    numbers (nested dicts of numbers too). Masking it would break the structure that holds it (a stored LangChain
    message whose ``usage_metadata`` must validate), and a number there is a count: a token is text."""
    if type(key) is not str or _TOKEN_COUNT_KEY.search(_KEY_SEPARATORS.sub("", key.lower())) is None:
        return False
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if len(stack) + len(item) > 64:  # usage details are a handful of counts
                return False
            stack.extend(item.values())
        elif type(item) not in (int, float):
            return False
    return True


_COMMAND_LINE_KEYS = frozenset({"args", "argv", "arguments", "command", "cmd", "command_line"})
"""The keys under which a list is a command line (a stdio binding's ``args``): only there is an option's value
masked by its name."""
_OPTION = re.compile(r"--?[A-Za-z][A-Za-z0-9_-]*")
_NOT_A_VALUE_OPTION = re.compile(r"--?no-|.*-(?:stdin|file|path)$")


def _mask_option_values(line: list[Any]) -> None:
    """In a command line (``["--api-key", "VALUE", ...]``), the item after an option that names a secret is masked:
    an option is one word of letters, digits, ``-`` and ``_`` after one or two dashes; ``--no-password``,
    ``--password-stdin`` and ``--token-file`` take no secret after them."""
    for index in range(1, len(line)):
        option, value = line[index - 1], line[index]
        if (
            type(option) is str
            and type(value) is str
            and value
            and _OPTION.fullmatch(option)
            and not _OPTION.fullmatch(value)
            and not _NOT_A_VALUE_OPTION.match(option)
            and is_secret_key(option.lstrip("-"))
        ):
            line[index] = MASK
    if line and type(line[0]) is str and _MYSQL_COMMAND.search(line[0]):  # ["mysql", "-u", "root", "-phunter22"]
        for index, item in enumerate(line):
            if type(item) is str and item.startswith("-p") and len(item) > 2 and item != "-p" + MASK:
                line[index] = "-p" + MASK


_MYSQL_COMMAND = re.compile(r"(?:^|/)(?:mysql|mariadb)[\w-]*$")


_PLAIN_SCALARS = frozenset({int, float, bool})  # a float is copied when finite (NaN and infinities: leaf)


def _rebuild(source: tuple[Any, ...] | set[Any] | frozenset[Any], items: list[Any]) -> Any:
    """A tuple/set of the same kind as ``source`` holding ``items``."""
    make: Callable[..., Any] | None = getattr(type(source), "_make", None)  # namedtuple
    try:
        if make is not None:
            return make(items)
        return type(source)(items)
    except TypeError:  # unhashable masked items in a set, exotic subclasses: plain containers
        return list(items) if isinstance(source, (set, frozenset)) else tuple(items)


def mask_value(value: Any, *, secrets: Iterable[str] = ()) -> Any:
    """A masked deep copy of ``value``; the input is never mutated.

    * ``str`` -> :func:`mask_text` (same ``secrets``); dict keys are masked as text too (two keys that mask
      to the same text are kept apart as ``"***"`` and ``"***~2"``).
    * dict value under a key that :func:`is_secret_key` recognises -> :data:`MASK`, whatever its type,
      unless it is ``None`` or empty (``""``, ``[]``, ``{}``), or a token count (a key ending in ``tokens`` or
      ``token_details`` holding a number or a dict of numbers: LangChain's ``input_token_details``), which stays
      as is; so is the ``value`` (``val``, ``content``, ``secret``) of a small dict whose ``name`` (``key``,
      ``header``, ``field``, ...) is a string naming a secret, and the second item of a ``(name, value)`` pair
      (a 2-tuple, or a 2-item list inside a list or tuple) whose first item names one.
    * dict / list / tuple / set -> the same kind, masked inside (dict subclasses come back as ``dict``); in a
      command line (a list under ``args``, ``argv``, ``command``, ...), the item after an option that names a
      secret (``"--api-key", "VALUE"``) is masked.
    * ``int``, ``float``, ``bool``, ``None``, ``Decimal``, dates/times, ``UUID``, enums -> unchanged.
    * bytes -> masked as UTF-8 text; pydantic models -> their masked ``model_dump(mode="json")``.
    * anything else -> its masked ``str()`` (fail closed: an unknown object could print a secret later).

    Iterative: any nesting depth works; a reference cycle is replaced by ``"<cycle>"``.
    """
    return _Walker(_resolve_matcher(secrets)).walk(value)


def holds_secret(value: Any) -> bool:
    """Whether ``value`` holds a secret the audit record hides: what a setting that is stored, shown and exported
    in clear must not hold. Give a field as ``{name: value}`` to be judged as the audit records it (a list under
    ``args`` is a command line). Known secret values (``secrets``, :func:`register_secrets`) are left out, so
    what a setting may hold does not depend on what this process has seen.

    Masking errs towards hiding: under a secret-looking name (``--credentials``, ``auth_mode``,
    ``password_min_length``) it hides whatever follows. A refusal counts only what could be a secret's value
    (:func:`_reads_as_secret`): not a path, a URL without a secret of its own, a variable's name, a word or words,
    a short text, nor a number given to a name that counts or bounds (``--token-ttl 604800``). What masking
    hides whole (an object under a secret-looking name) is judged leaf by leaf. What masking changes only to
    store it (a NUL, a lone surrogate, a NaN) is no secret."""
    stack: list[tuple[Any, Any, str]] = [(value, _Walker(None).walk(value), "")]
    while stack:
        given, shown, context = stack.pop()
        if isinstance(given, dict) and isinstance(shown, dict) and len(given) == len(shown):
            for (name, item), (shown_name, shown_item) in zip(given.items(), shown.items(), strict=True):
                stack.extend(((name, shown_name, ""), (item, shown_item, str(name))))
        elif isinstance(given, (list, tuple)) and isinstance(shown, (list, tuple)) and len(given) == len(shown):
            for at, (item, shown_item) in enumerate(zip(given, shown, strict=True)):
                before = given[at - 1] if at and isinstance(given[at - 1], str) else context  # an option's value
                stack.append((item, shown_item, before))
        elif isinstance(given, dict) and shown != given:  # hidden whole: each leaf as hidden
            stack.extend((item, MASK, str(name)) for name, item in given.items())
        elif isinstance(given, (list, tuple)) and shown != given:
            stack.extend((item, MASK, context) for item in given)
        elif isinstance(given, str) and isinstance(shown, str):
            stored = storable_text(given)
            if stored != shown and any(
                _reads_as_secret(part, f"{context} {before}") for part, before in _hidden_parts(stored, shown)
            ):
                return True
        elif (
            isinstance(given, (int, float))
            and not isinstance(given, bool)
            and given != shown
            and math.isfinite(given)
            and _reads_as_secret(str(given), context)
        ):
            return True
    return False


_PATH_START = re.compile(r"[/~.]|[A-Za-z]:[\\/]|\$\{")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
# A variable's name: capitals with an underscore (GITHUB_TOKEN), or ending in what it names (PGPASSWORD).
_VARIABLE_NAME = re.compile(
    r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+|[A-Z][A-Z0-9]*(?:KEY|TOKEN|PASSWORD|PASS|PWD|SECRET|CREDENTIALS?|AUTH)"
)
_JOINED_WORDS = re.compile(r"[A-Za-z]+(?:[-_.][A-Za-z]+)+")
_NAME_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
_LAST_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*(?=[^A-Za-z0-9_.-]*\Z)")
# The words of a name whose number counts or bounds something (``password_min_length``, ``--token-ttl``).
_BOUND_WORDS = frozenset(
    {"min", "max", "len", "length", "count", "size", "limit", "timeout", "ttl", "retries", "retry", "attempts",
     "age", "days", "hours", "minutes", "seconds", "secs", "ms", "expiry", "expires", "port", "version"}
)  # fmt: skip
# Under a code's name (_code_kind) also what is counted, dated or identified: "otp_sent_at", "mfa_users", "pin_id".
_CODE_COUNT_WORDS = _BOUND_WORDS | frozenset(
    {"at", "date", "id", "ids", "users", "sent", "enabled", "enrolled", "window", "digits", "lockout",
     "total", "rate", "status", "type"}
)  # fmt: skip
_MASK_IN_TEXT = re.compile(re.escape(MASK) + r"(?:~[0-9]+)?")


def _counts_or_bounds(context: str) -> bool:
    """Whether the name last written in ``context`` (a key, an option before its value) counts or bounds."""
    found = _LAST_NAME.search(context.strip(" =:\"'"))
    return found is not None and any(w.lower() in _BOUND_WORDS for w in _NAME_WORD.findall(found[0]))


def _hidden_parts(stored: str, shown: str) -> list[tuple[str, str]]:
    """The parts of ``stored`` that masking replaced with the mask in ``shown``, each with the text before it
    (where its option's or key's name is): the text between the literal pieces ``shown`` keeps, found in order
    (linear; a text masked in another way counts whole)."""
    literals = _MASK_IN_TEXT.split(shown)
    if len(literals) == 1 or not stored.startswith(literals[0]) or not stored.endswith(literals[-1]):
        return [(stored, "")]
    parts: list[tuple[str, str]] = []
    at, end = len(literals[0]), len(stored) - len(literals[-1])
    for literal in literals[1:-1]:
        found = stored.find(literal, at, end) if literal else at
        if found < 0:
            return [(stored, "")]
        parts.append((stored[at:found], stored[max(0, at - 80) : at]))
        at = found + len(literal)
    parts.append((stored[at:end] if end >= at else "", stored[max(0, at - 80) : at]))
    return parts


def _reads_as_secret(text: str, context: str = "") -> bool:
    """Whether a part the masker hid could be a secret's value rather than a setting's. It could not be a path or
    a ``${VAR}`` reference, a URL with no secret of its own, a variable's name (``GITHUB_TOKEN``, ``PGPASSWORD``),
    a text of fewer than four characters, a word of fewer than sixteen letters (``oauth``, ``ServiceAccount``),
    words joined by ``-``, ``_`` or ``.`` (``client-credentials``, ``X-Api-Key``), a number of fewer than six
    digits or one given to a name that counts or bounds (``context``: ``--token-ttl``), nor another text of fewer
    than eight characters (``oauth2``). A value matching a secret's own shape (``sk-…``, a JWT, a PEM key, an AWS
    key id) always could."""
    text = text.strip().strip("\"'")
    if _API_KEY_PREFIX.match(text) or _JWT.search(text) or _AWS_ACCESS_KEY_ID.search(text) or "PRIVATE KEY" in text:
        return True
    if len(text) < MIN_SECRET_LENGTH or text.lower() in _NOT_A_SECRET_VALUE:
        return False
    if _PATH_START.match(text) or _VARIABLE_NAME.fullmatch(text):
        return False
    if _URL.match(text):
        return holds_secret({"url": text})  # its query or user info, as a URL setting is judged
    if text.isdigit():
        return len(text) >= 6 and not _counts_or_bounds(context)
    if text.isalpha():
        return len(text) >= 16
    if _JOINED_WORDS.fullmatch(text):
        return False
    return len(text) >= MIN_ENCODED_SECRET_LENGTH


def truncate(value: Any, *, max_chars: int = 20_000) -> Any:
    """``value`` if its JSON text fits in ``max_chars`` characters, else a small stand-in for storage.

    The JSON text is ``json.dumps(value, ensure_ascii=False, default=str)`` (``repr`` if that fails). When it
    is longer than ``max_chars`` this returns ``{"truncated": True, "original_chars": <length>, "preview":
    <its first max_chars characters>}``. It does not mask: mask first, then truncate, because a secret cut
    in half by the preview would no longer be recognised.
    """
    if max_chars < 0:
        raise ValueError("max_chars must be >= 0")
    try:
        dumped = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):  # non-str keys, cycles
        dumped = repr(value)
    if len(dumped) <= max_chars:
        return value
    return {"truncated": True, "original_chars": len(dumped), "preview": dumped[:max_chars]}


# --- logging ---------------------------------------------------------------------------------------------------

_STANDARD_RECORD_ATTRIBUTES = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}
_TRACEBACK_FORMATTER = logging.Formatter()


class SecretMaskingFilter(logging.Filter):
    """A logging filter that masks a record in place before any handler formats it. Always returns True.

    Attach it to handlers (``install_logging_filter`` does it for every existing handler; Django's LOGGING
    names it in ``filters``). A handler filter sees records propagated from every logger, unlike a logger
    filter. It sets ``record.msg`` to the masked, already formatted message and ``record.args`` to None;
    formats ``exc_info`` into a masked ``record.exc_text`` and drops ``exc_info`` (so no handler can
    re-render the raw exception or its frames); masks ``stack_info`` and ``extra=`` attributes. Masking uses
    the registered secrets only. If masking fails the message is replaced, never let through.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            _mask_record(record)
        except Exception:  # noqa: BLE001 - a log call must never raise, nor leak
            record.msg = "<log message withheld: masking failed>"
            record.args = None
            record.exc_info = None
            record.exc_text = None
            record.stack_info = None
        return True


def _mask_record(record: logging.LogRecord) -> None:
    matcher = _resolve_matcher(())
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - bad format args: log the template rather than nothing
        message = str(record.msg)
    record.msg = _mask_str(message, matcher)
    record.args = None
    if record.exc_info and not record.exc_text:
        record.exc_text = _TRACEBACK_FORMATTER.formatException(record.exc_info)
    record.exc_info = None
    if record.exc_text:
        record.exc_text = _mask_str(record.exc_text, matcher)
    if record.stack_info:
        record.stack_info = _mask_str(record.stack_info, matcher)
    extras = [name for name in record.__dict__ if name not in _STANDARD_RECORD_ATTRIBUTES]
    if extras:
        walker = _Walker(matcher)
        for name in extras:
            value = record.__dict__[name]
            code = _code_kind(name)
            if (is_secret_key(name) and not _is_empty(value)) or (code is not None and _is_code_value(value, code)):
                record.__dict__[name] = MASK
            elif isinstance(value, (str, dict, list, tuple)):  # objects (e.g. Django's request) stay
                record.__dict__[name] = walker.walk(value)


_SHARED_FILTER = SecretMaskingFilter()


def install_logging_filter() -> None:
    """Attach a :class:`SecretMaskingFilter` to every handler of the root logger and of every logger that
    exists now, so library logs are masked too. Idempotent: a handler that already has one is left alone.
    Handlers added later are not covered: call this again after configuring logging."""
    loggers: list[logging.Logger] = [logging.getLogger()]
    loggers += [item for item in list(logging.Logger.manager.loggerDict.values()) if isinstance(item, logging.Logger)]
    for logger in loggers:
        for handler in list(logger.handlers):
            if not any(isinstance(existing, SecretMaskingFilter) for existing in handler.filters):
                handler.addFilter(_SHARED_FILTER)
