"""A bound secret inside an encoded text that is wrapped or grouped (s37): ``base64.encodebytes`` output (76 columns,
as the ``base64`` command writes it; PEM's 64), ``xxd``'s hex in groups of four digits, base32 over two lines. Where
the secret's encoded form straddles a line break or a space it is masked as where it is unbroken, at every alignment
of the secret inside the encoded text (for base32: where the secret starts a group of five bytes, or stands alone); an
encoded text with no secret in it is left as it is."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import textwrap
from collections.abc import Callable

import pytest

from audit.masking import MASK, mask_text

SECRET = "crmToken-7f3a9c2e51"
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/=]+")
_HEX_RUN = re.compile(r"[0-9A-Fa-f]+")


def _config(padding: int) -> bytes:
    """A config file whose token starts ``padding`` bytes further on for each ``padding``."""
    return f"# {'x' * padding}\nendpoint=https://crm.example/api\napi_token={SECRET}\nretries=3\n".encode()


def _base64_cores() -> set[str]:
    """The characters of the secret's base64 that stay the same wherever it stands in a longer text."""
    cores = set()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + SECRET.encode() + b"\0\0").decode()
        cores.add(encoded[-(-8 * offset // 6) : (8 * offset + 8 * len(SECRET)) // 6])
    return cores


def _decodes_to_secret(masked: str) -> bool:
    """Whether any base64 run of ``masked`` (whitespace removed, cut at the mask) decodes, at any of its four
    alignments, to text holding the secret."""
    for run in _BASE64_RUN.findall("".join(masked.split())):
        for start in range(4):
            body = run[start:].rstrip("=")
            body = body[: len(body) // 4 * 4]
            if SECRET.encode() in base64.b64decode(body):
                return True
    return False


def _wrapped(encoded: str, width: int, newline: str) -> str:
    return newline.join(textwrap.wrap(encoded, width)) + newline


@pytest.mark.parametrize(
    ("width", "newline"),
    [(76, "\n"), (76, "\r\n"), (64, "\n")],
    ids=["encodebytes", "encodebytes-crlf", "pem-64"],
)
def test_a_secret_in_wrapped_base64_is_masked_at_every_alignment_and_break(width: int, newline: str) -> None:
    cores = _base64_cores()
    straddled = 0
    for padding in range(77):
        encoded = _wrapped(base64.b64encode(_config(padding)).decode(), width, newline)
        if width == 76 and newline == "\n":
            assert encoded == base64.encodebytes(_config(padding)).decode()
        joined = "".join(encoded.split())
        core_at, core = min((joined.find(core), core) for core in cores if core in joined)
        line_of = [i for i, char in enumerate(encoded) if not char.isspace()]  # where each character stands
        straddled += line_of[core_at + len(core) - 1] - line_of[core_at] != len(core) - 1  # a break inside it

        masked = mask_text(encoded, secrets=[SECRET])

        assert masked.count(MASK) == 1, padding
        assert not any(core in "".join(masked.split()) for core in cores), padding
        assert not _decodes_to_secret(masked), padding
        assert len(encoded) - len(masked) < len(base64.b64encode(SECRET.encode())) + 2 * len(newline)  # no more
        assert masked.startswith(encoded[: line_of[core_at] - 4])  # the text before the secret is kept
    assert straddled >= 10  # the break fell inside the secret's base64 for many paddings


@pytest.mark.parametrize("case", [str.lower, str.upper], ids=["xxd", "upper"])
def test_a_secret_in_hex_grouped_by_four_digits_is_masked(case: Callable[[str], str]) -> None:
    hexed = SECRET.encode().hex()
    for padding in range(16):
        digits = case(_config(padding).hex())
        groups = [digits[at : at + 4] for at in range(0, len(digits), 4)]
        dump = "\n".join(" ".join(groups[at : at + 8]) for at in range(0, len(groups), 8)) + "\n"
        assert hexed not in dump.lower()  # broken up by the grouping

        masked = mask_text(dump, secrets=[SECRET])

        assert masked.count(MASK) == 1, padding
        assert hexed not in "".join(masked.split()).lower(), padding
        for run in _HEX_RUN.findall("".join(masked.split())):
            for start in range(2):
                body = run[start:]
                assert SECRET.encode() not in binascii.unhexlify(body[: len(body) // 2 * 2]), padding


def _base32_aligned_paddings() -> list[int]:
    """The paddings that start the token at a group of five bytes: where base32 is matched inside a longer text."""
    return [padding for padding in range(10) if _config(padding).index(SECRET.encode()) % 5 == 0]


def test_a_secret_in_base32_over_two_lines_is_masked_at_every_break() -> None:
    for padding in _base32_aligned_paddings():
        config = _config(padding)
        at = config.index(SECRET.encode())
        first, last = at * 8 // 5, -(-(at + len(SECRET)) * 8 // 5)  # the characters the secret's bits are in
        for case in (str.upper, str.lower):
            encoded = case(base64.b32encode(config).decode())
            for cut in range(first + 1, last):
                split = f"{encoded[:cut]}\n{encoded[cut:]}\n"

                masked = mask_text(split, secrets=[SECRET])

                assert masked.count(MASK) == 1, (padding, cut)
                for run in re.findall(r"[A-Za-z2-7=]+", "".join(masked.split())):
                    for start in range(8):
                        body = run[start:].rstrip("=").upper()
                        assert SECRET.encode() not in base64.b32decode(body[: len(body) // 8 * 8]), (padding, cut)


def test_a_secret_in_base32_over_two_lines_on_its_own_is_masked() -> None:
    encoded = base64.b32encode(SECRET.encode()).decode()
    for cut in range(1, len(encoded)):
        assert mask_text(f"token:\n{encoded[:cut]}\n{encoded[cut:]}\n", secrets=[SECRET]) == f"token:\n{MASK}\n"


def test_a_long_base64_blob_without_the_secret_is_left_as_it_is() -> None:
    data = b"".join(hashlib.sha256(n.to_bytes(4, "big")).digest() for n in range(640))  # 20 KB, fixed
    known = [SECRET, "another-Secret-42", "db-Password-31337", "tenant-acme-0001", "sk_live_local_only_0001"]
    blob = base64.encodebytes(data).decode()
    assert mask_text(blob, secrets=known) == blob
    groups = data.hex()
    dump = "\n".join(
        " ".join(groups[at + column : at + column + 4] for column in range(0, 32, 4))
        for at in range(0, len(groups), 32)
    )
    assert mask_text(dump, secrets=known) == dump
    wrapped_b32 = "\n".join(textwrap.wrap(base64.b32encode(data).decode(), 76))
    assert mask_text(wrapped_b32, secrets=known) == wrapped_b32


def test_the_config_around_a_secret_in_plain_text_is_kept() -> None:
    text = _config(3).decode()
    assert mask_text(text, secrets=[SECRET]) == text.replace(SECRET, MASK)


def test_a_secret_in_unbroken_base32_of_a_longer_text_is_masked() -> None:
    for config in (f"api_token={SECRET}; retries=3", f"# base: 1\napi_token={SECRET}\xff"):  # at 10 and at 20 bytes
        encoded = base64.b32encode(config.encode()).decode()
        assert base64.b32encode(SECRET.encode()).decode().rstrip("=") not in encoded  # its last character differs
        for text in (encoded, encoded.lower()):
            masked = mask_text(f"config: {text}\n", secrets=[SECRET])
            assert masked.count(MASK) == 1, config
