"""The API's one request parser: JSON, bounded, and nothing a database or the platform's own code cannot hold.

``BoundedJSONParser`` refuses, with a ``400 invalid_json`` (DRF's ``ParseError``), before any view sees it:

- a body longer than ``PLATFORM_API_MAX_BODY_BYTES`` (``413 body_too_large``; counted while it is read, so a
  request whose ``Content-Length`` understates it cannot slip past — the middleware and the ASGI wrapper in
  ``agent_platform/body_limit.py`` have already refused one that states it);
- nesting deeper than ``PLATFORM_API_MAX_JSON_DEPTH`` (checked on the raw text before parsing: Python's parser
  and every recursive walk after it — masking, digests, storage — would otherwise raise ``RecursionError``);
- ``NaN``, ``Infinity``, ``-Infinity`` and numbers that overflow to them (``1e999``): neither JSON nor storable;
- integers beyond 64 bits (what SQLite and most clients hold) and text with NUL characters or unpaired
  surrogates (``"\\ud800"``): PostgreSQL refuses the first, no UTF-8 encoder takes the second;
- text that is not UTF-8 (RFC 8259 JSON is UTF-8; a ``charset`` other than UTF-8 is refused).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from itertools import accumulate
from typing import IO, Any

from django.utils.translation import gettext as _
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser

from agent_platform.errors import ApplicationError
from agent_platform.json import json_error_text
from agents.api.config import api_setting

INT_MIN, INT_MAX = -(2**63), 2**63 - 1
# A string, or an unterminated one to the end of the text: the first attempt from each quote always matches,
# so the scan is linear on any input (without the ``\Z`` branch, ``"\"\"\"…`` would be quadratic).
_STRING = re.compile(r'"(?:[^"\\]|\\.?)*(?:"|\Z)', re.DOTALL)
_NOT_A_BRACKET = re.compile(r"[^\[\]{}]+")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class _Refused(ValueError):
    """A value the parser hooks refuse; its message is for the caller."""


def json_depth(text: str) -> int:
    """How deeply arrays and objects nest in ``text`` (brackets inside strings do not count). Linear, and
    without recursion, so it is safe on any input; on text that is not JSON the number means little, and the
    parser that runs next refuses that text anyway."""
    brackets = _NOT_A_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(_DEPTH_STEP[c] for c in brackets), default=0)


def _refuse_constant(name: str) -> Any:
    raise _Refused(_("%(name)s is not a JSON number.") % {"name": name})


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(_("The number %(number).40s is too large.") % {"number": text})
    return value


def _bounded_int(text: str) -> int:
    if len(text) > 20:
        raise _Refused(_("The integer %(number).40s… is out of range.") % {"number": text})
    value = int(text)
    if not INT_MIN <= value <= INT_MAX:
        raise _Refused(_("The integer %(number)s is out of range.") % {"number": text})
    return value


def _refuse_unstorable_text(value: Any) -> None:
    """Walk the parsed value (iteratively; its depth is already bounded) for text no database stores."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, Mapping):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str):
            if "\x00" in item:
                raise _Refused(_("Text may not contain NUL characters."))
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise _Refused(_("Text may not contain unpaired surrogates (\\ud800–\\udfff).")) from None


def json_parse_bounded(raw: bytes, *, max_depth: int) -> Any:
    """``raw`` (UTF-8 JSON) as Python values. Raises ``ParseError`` (400 ``invalid_json``) for anything the module
    docstring lists, never ``RecursionError`` or another exception."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ParseError(_("The body is not UTF-8 text.")) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    depth = json_depth(text)
    if depth > max_depth:
        raise ParseError(_("JSON nested deeper than %(max)d levels.") % {"max": max_depth})
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_bounded_int)
        _refuse_unstorable_text(value)
    except _Refused as exc:
        raise ParseError(str(exc)) from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise ParseError(_("The body is not valid JSON: %(error)s") % {"error": json_error_text(exc)}) from None
    return value


def read_bounded(stream: IO[bytes] | None, *, limit: int) -> bytes:
    """At most ``limit`` bytes of ``stream``; raises ``ApplicationError`` (413 ``body_too_large``) if there are
    more. Reads in chunks, so a lying ``Content-Length`` never makes it hold more than ``limit`` + one chunk."""
    if stream is None:
        return b""
    chunks: list[bytes] = []
    size = 0
    while chunk := stream.read(min(64 * 1024, limit + 1 - size) or 1):
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def body_too_large(limit: int) -> ApplicationError:
    return ApplicationError(
        _("The body is larger than %(max)d bytes.") % {"max": limit}, code="body_too_large", status=413
    )


class BoundedJSONParser(BaseParser):
    """DRF's ``JSONParser``, bounded (see the module docstring). Only UTF-8 is accepted."""

    media_type = "application/json"

    def parse(self, stream: IO[bytes] | None, media_type: str | None = None, parser_context: Any = None) -> Any:
        encoding = ((parser_context or {}).get("encoding") or "utf-8").lower().replace("_", "-")
        if encoding not in {"utf-8", "utf8"}:
            raise ParseError(_("JSON must be UTF-8, not %(charset).40s.") % {"charset": encoding})
        raw = read_bounded(stream, limit=int(api_setting("PLATFORM_API_MAX_BODY_BYTES")))
        if not raw.strip():
            raise ParseError(_("The body is empty: send a JSON object."))
        return json_parse_bounded(raw, max_depth=int(api_setting("PLATFORM_API_MAX_JSON_DEPTH")))
