"""Forms of a known secret and shapes of a structure that masking must get right:

* defect A: a token count under a key that looks secret (LangChain's ``input_token_details``) is a count, kept as
  it is, so a stored conversation still validates; a token under such a key is still masked;
* defect C: a secret with ``/`` relayed in JSON that escapes it (``\\/``) or in HTML (``&#x2F;``, ``&#47;``);
* defect D: a Korean secret in the other Unicode normalization form (bound NFC, echoed NFD, and the reverse)."""

from __future__ import annotations

import json
import unicodedata

import pytest

from audit.masking import MASK, mask_text, mask_value

SLASHED = "tok/en-9f3a/7c21"
KOREAN = "비밀한글열쇠-42"  # composed (NFC), as typed


def test_langchains_token_details_are_kept_as_counts() -> None:
    usage = {
        "input_tokens": 100,
        "output_tokens": 10,
        "total_tokens": 110,
        "input_token_details": {"cache_read": 40},
        "output_token_details": {"reasoning": 0, "audio": 0},
    }
    assert mask_value({"usage_metadata": usage}) == {"usage_metadata": usage}


@pytest.mark.parametrize(
    "value",
    [
        {"token": 123456},
        {"access_token_details": "eyJhbGciOi-secret-text"},
        {"input_token_details": {"cache_read": "sk-not-a-count-5f2b"}},
        {"access_tokens": ["tok-1234567", "tok-7654321"]},
        {"password": 1234},
    ],
    ids=["a-numeric-token", "text-under-details", "text-inside-details", "a-list-of-tokens", "a-numeric-password"],
)
def test_what_is_no_count_under_a_secret_key_is_still_masked(value: dict[str, object]) -> None:
    ((key, _given),) = value.items()
    assert mask_value(value) == {key: MASK}


@pytest.mark.parametrize(
    "form",
    [
        json.dumps(SLASHED)[1:-1].replace("/", "\\/"),
        "tok&#x2F;en-9f3a&#x2F;7c21",
        "tok&#x2f;en-9f3a&#x2f;7c21",
        "tok&#47;en-9f3a&#47;7c21",
    ],
    ids=["json-escaped-slash", "html-hex-entity", "html-hex-entity-lower", "html-decimal-entity"],
)
def test_a_secret_with_a_slash_is_masked_where_the_slash_is_escaped(form: str) -> None:
    text = f'{{"result": "the key is {form}"}}'
    assert mask_text(text, secrets=[SLASHED]) == f'{{"result": "the key is {MASK}"}}'


def test_a_secret_with_a_slash_is_masked_in_json_written_with_escaped_slashes_inside_a_structure() -> None:
    relayed = {"body": '{"echo":"' + SLASHED.replace("/", "\\/") + '"}'}
    assert mask_value(relayed, secrets=[SLASHED]) == {"body": '{"echo":"' + MASK + '"}'}


@pytest.mark.parametrize(
    ("bound", "echoed"),
    [
        (KOREAN, unicodedata.normalize("NFD", KOREAN)),
        (unicodedata.normalize("NFD", KOREAN), KOREAN),
    ],
    ids=["bound-nfc-echoed-nfd", "bound-nfd-echoed-nfc"],
)
def test_a_korean_secret_is_masked_in_the_other_normalization_form(bound: str, echoed: str) -> None:
    assert bound != echoed
    assert mask_text(f"값: {echoed} 입니다", secrets=[bound]) == f"값: {MASK} 입니다"
    assert mask_value({"rows": [{"memo": echoed}]}, secrets=[bound]) == {"rows": [{"memo": MASK}]}
    # Escaped as JSON with ASCII escapes, the decomposed form too.
    assert echoed not in mask_text(json.dumps({"memo": echoed}), secrets=[bound])
    assert json.dumps(echoed)[1:-1] not in mask_text(json.dumps({"memo": echoed}), secrets=[bound])
