"""Plain JSON (``audit.chain.json_value_plain``): an event whose ``args`` and ``result`` texts are plain is hashed
through orjson instead of ``json``. Both ways must give the same bytes for every value the databases can give
back, in every form they write it (SQLite: Python's own JSON text; PostgreSQL: jsonb's, numbers as decimals), or
an intact chain would fail to verify (or a forged one pass)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from audit.chain import GENESIS_HASH, canonical_bytes, json_value, json_value_plain, pending_hash, record_check
from audit.chain_keys import ChainKeyring

KEYRING = ChainKeyring(["k" * 40])

# Numbers as any JSON text may write them: exponents either case and sign, trailing zeros, tiny and huge values.
NUMBER_TEXT = st.one_of(
    st.integers().map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(0, 12).flatmap(
        lambda places: st.decimals(allow_nan=False, allow_infinity=False, places=places).map(lambda d: format(d, "f"))
    ),
    st.builds(
        lambda mantissa, exponent, mark: f"{mantissa}{mark}{exponent}",
        st.integers(-999, 999),
        st.integers(-30, 30),
        st.sampled_from(["e", "E", "e+", "E-"]),
    ),
    st.sampled_from(
        ["-0", "-0.0", "0.0000", "0.00001", "1.50", "4.0", "4.00", "1e-4", "0.0001", "1e16", "1.5e-07", "1e999"]
    ),
    st.sampled_from(["1" + "0" * 400 + ".5", "-1" + "0" * 400 + ".5", "1" + "0" * 30, "0." + "0" * 400 + "1"]),
)
TEXT = st.text(st.characters(codec="utf-8"), max_size=8) | st.sampled_from(
    ["김하늘", "NaN", "e-mail", "v4.0", "\u2028", "\x7f\x80\x9f", '"\\/', "\ud800"]
)


def _json_text(draw: Any, depth: int = 0) -> str:
    """A JSON text built from its pieces, so that numbers come in every form a database may write."""
    kind = draw(st.sampled_from(["number", "string", "literal", "list", "object"] if depth < 3 else ["number"]))
    if kind == "number":
        return str(draw(NUMBER_TEXT))
    if kind == "string":
        return json.dumps(draw(TEXT), ensure_ascii=draw(st.booleans()))
    if kind == "literal":
        return str(draw(st.sampled_from(["null", "true", "false", "NaN", "Infinity", "-Infinity"])))
    if kind == "list":
        items = [_json_text(draw, depth + 1) for _ in range(draw(st.integers(0, 3)))]
        return "[" + ", ".join(items) + "]"
    keys = draw(st.lists(TEXT, max_size=3))
    return "{" + ", ".join(f"{json.dumps(key)}: {_json_text(draw, depth + 1)}" for key in keys) + "}"


JSON_TEXT = st.composite(_json_text)()
LATENCY = st.none() | st.integers(-(2**70), 2**70) | st.floats() | st.sampled_from([2.5, 3.0, 1e-5, 0.0001, -0.0])


def _record(args: Any, result: Any, latency_ms: Any) -> dict[str, Any]:
    return {
        "seq": 7,
        "prev_hash": GENESIS_HASH,
        "created_at": dt.datetime(2026, 12, 2, 3, 4, 5, 6, tzinfo=dt.UTC),
        "run_id": uuid.UUID(int=5),
        "source": "agent",
        "action": "tool.call",
        "mcp_id": "demo",
        "tool": "search_employee",
        "call_id": "c1",
        "args": args,
        "result": result,
        "ok": True,
        "reason": "",
        "attempt": 1,
        "latency_ms": latency_ms,
        "actor": "김하늘",
    }


def _both_ways(record: dict[str, Any], plain: bool) -> None:
    """Every hashing entry point gives the same answer with ``plain`` as the exact way (``json``) does."""
    for normalized in (False, True):
        try:
            exact = canonical_bytes(record, normalized=normalized)
        except (TypeError, ValueError) as exc:
            with pytest.raises(type(exc)):
                canonical_bytes(record, normalized=normalized, plain=plain)
            continue
        assert canonical_bytes(record, normalized=normalized, plain=plain) == exact
    try:
        exact_pending = pending_hash(record)
    except (TypeError, ValueError):
        exact_pending = None
    if exact_pending is not None:
        assert pending_hash(record, plain=plain) == exact_pending
    assert record_check(dict(record), "", KEYRING, plain=plain) == record_check(dict(record), "", KEYRING)


@pytest.mark.slow
@hypothesis_settings(max_examples=400, deadline=None)
@given(args_text=JSON_TEXT, result_text=JSON_TEXT, latency_ms=LATENCY)
def test_plain_json_hashes_to_the_bytes_of_the_exact_way(args_text: str, result_text: str, latency_ms: Any) -> None:
    try:
        args, args_plain = json_value_plain(args_text)
        result, result_plain = json_value_plain(result_text)
    except ValueError:  # not JSON at all: nothing to hash
        return
    assert (args, result) == (json_value(args_text), json_value(result_text)) or "NaN" in args_text + result_text
    _both_ways(_record(args, result, latency_ms), args_plain and result_plain)


@pytest.mark.parametrize(
    ("text", "plain"),
    [
        ('{"팀": "클라우드운영팀", "level": 3.5, "n": 4.0}', True),
        ('{"n": 1e-05}', False),  # Python writes 1e-05, orjson 0.00001
        ('{"n": 0.00001}', False),
        ('{"n": 0.0001}', True),
        ('{"n": NaN}', False),  # orjson would write null
        ('{"n": -Infinity}', False),
        ('{"n": 1e999}', False),  # read as inf
        ('{"mail": "e-mail", "NaN": "0.00001", "n": 1e300, "m": -0.0}', True),  # only values count; ints all
    ],
)
def test_what_is_plain(text: str, plain: bool) -> None:
    assert json_value_plain(text)[1] is plain


def test_a_null_column_is_none_and_plain() -> None:
    assert json_value_plain(None) == (None, True)


@pytest.mark.parametrize(
    "value",
    [
        {"big": 2**64},  # orjson writes no integer past 64 bits: the exact way
        {"s": "\ud800"},  # a lone surrogate: likewise
        {"when": dt.datetime(2026, 1, 1, tzinfo=dt.UTC)},  # not JSON: raises the exact way's TypeError
        {"d": decimal.Decimal("1.5")},
    ],
)
def test_values_orjson_does_not_write_alike_take_the_exact_way(value: dict[str, Any]) -> None:
    _both_ways(_record(value, None, 2.5), plain=True)
