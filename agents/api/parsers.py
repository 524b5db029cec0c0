"""The API's one request parser: JSON, bounded, and nothing a database or the platform's own code cannot hold.

``BoundedJSONParser`` refuses, with a ``400 invalid_json`` (DRF's ``ParseError``), before any view sees it:

- a body longer than ``PLATFORM_API_MAX_BODY_BYTES`` (``413 body_too_large``; counted while it is read, so a
  request whose ``Content-Length`` understates it cannot slip past — the middleware and the ASGI wrapper in
  ``agent_platform/body_limit.py`` have already refused one that states it);
- nesting deeper than ``PLATFORM_API_MAX_JSON_DEPTH`` (checked on the raw text before parsing: Python's parser
  and every recursive walk after it — masking, digests, storage — would otherwise raise ``RecursionError``);
- more than ``PLATFORM_API_MAX_JSON_ITEMS`` values (counted in the same pass over the raw text: a body of many
  tiny values, ``[[],[],…]``, cost seconds of parsing, masking and normalizing within the byte limit), answered
  ``400 too_many_json_values`` naming the limit;
- an object that gives a key twice (Python's parser keeps the last: ``{"decision": "reject", "decision":
  "approve"}`` would approve), at any depth;
- ``NaN``, ``Infinity``, ``-Infinity`` and numbers that overflow to them (``1e999``): neither JSON nor storable;
- integers beyond 64 bits (what SQLite and most clients hold) and text with NUL characters or unpaired
  surrogates (``"\\ud800"``): PostgreSQL refuses the first, no UTF-8 encoder takes the second;
- text that is not UTF-8 (RFC 8259 JSON is UTF-8); a ``charset`` other than UTF-8, one Python does not know
  included (Django drops those, and the body was read as UTF-8), is a ``415 unsupported_media_type``, as the A2A
  and MCP endpoints answer it.

A refused number, text or repeated key is placed: the message starts with its path in the body
(``context.userId: Text may not contain NUL characters.``), and the REST answer's ``fields`` names the path too.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from itertools import accumulate
from typing import IO, Any

from django.utils.translation import gettext as _
from rest_framework.exceptions import ParseError, UnsupportedMediaType
from rest_framework.parsers import BaseParser

from agent_platform.errors import ApplicationError
from agent_platform.json import json_error_text
from agent_platform.text import nfc
from agents.api.config import api_setting
from audit.masking import mask_text
from audit.visible import visible_text

INT_MIN, INT_MAX = -(2**63), 2**63 - 1
# A string, or an unterminated one to the end of the text: the first attempt from each quote always matches,
# so the scan is linear on any input (without the ``\Z`` branch, ``"\"\"\"…`` would be quadratic).
_STRING = re.compile(r'"(?:[^"\\]|\\.?)*(?:"|\Z)', re.DOTALL)
_NOT_A_BRACKET = re.compile(r"[^\[\]{}]+")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
# The most characters of a caller's text (a key, a charset) repeated in an error message.
SHOWN_MAX_CHARS = 100


class _Unstorable:
    """A number no database holds, left by a parse hook where the number was: the hooks are not told where they
    are in the document, the walk after parsing is (:func:`_first_unstorable`), so that it can name the place."""

    __slots__ = ("problem",)

    def __init__(self, problem: str) -> None:
        self.problem = problem


class _KeyGivenTwice(dict[str, Any]):
    """An object that gives ``key`` twice, left in place for the walk after parsing to name where it is (as
    :class:`_Unstorable`); it never leaves this module."""

    def __init__(self, pairs: list[tuple[str, Any]], key: str) -> None:
        super().__init__(pairs)
        self.key = key


class UnstorableJSON(ParseError):
    """JSON that parses but holds a value no database stores (or an object giving a key twice), saying where:
    ``path`` (``context.userId``, ``a2a_data[0].rows[3]``; "" for the body itself) and ``problem``. Its detail is
    both, ``path: problem``: in a large body a problem not placed could not be found."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path = path
        self.problem = problem


class TooManyJSONValues(ParseError):
    """JSON with more values than ``PLATFORM_API_MAX_JSON_ITEMS``: a ``ParseError`` (the A2A and MCP endpoints
    answer it as any parse error), which the REST parser answers as ``400 too_many_json_values``."""


def shown_text(text: str) -> str:
    """A caller's ``text`` for an error message: its first :data:`SHOWN_MAX_CHARS` characters (``…`` after them
    where there were more), what does not show itself written out (``⟦U+0085⟧``)."""
    cut = text[:SHOWN_MAX_CHARS]
    return visible_text(cut) + ("…" if len(text) > SHOWN_MAX_CHARS else "")


def _outside_strings(text: str) -> str:
    """``text`` without its strings. Linear, and without recursion, so it is safe on any input (as is all that is
    measured on it below); on text that is not JSON the measures mean little, and the parser refuses that text."""
    return _STRING.sub("", text)


def _brackets(outside: str) -> str:
    return _NOT_A_BRACKET.sub("", outside.replace(",", ""))  # commas first: in C, not one regex match each


def _depth(brackets: str) -> int:
    return max(accumulate(_DEPTH_STEP[c] for c in brackets), default=0)


def _deeper_at_a_glance(brackets: str, max_depth: int) -> bool:
    """Whether more than ``max_depth`` arrays or objects open in a row (a search in C; the exact depth is a walk in
    Python, which a body of too many values need not wait for)."""
    return re.search("[\\[{]{%d}" % (max_depth + 1), brackets) is not None  # noqa: UP031 (braces of the regex)


def _values(outside: str) -> int:
    """The values counted outside strings: each array and object, and each element or member after a comma (a
    flat array of N numbers counts N, an object of N members N; the scalar at the top counts 0)."""
    return outside.count("[") + outside.count("{") + outside.count(",")


def json_depth(text: str) -> int:
    """How deeply arrays and objects nest in ``text`` (brackets inside strings do not count); see
    :func:`_outside_strings`."""
    return _depth(_brackets(_outside_strings(text)))


def _object_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members as a dict, or a :class:`_KeyGivenTwice` naming the first key given twice, keys
    compared composed (NFC): what a run stores is composed, so "부서" typed composed and decomposed became one key,
    the last value silently winning."""
    found = dict(pairs)
    if len(found) != len(pairs) or (
        not all(key.isascii() for key in found) and len({nfc(k) for k in found}) != len(found)
    ):
        seen: set[str] = set()
        for key, _value in pairs:
            if nfc(key) in seen:
                return _KeyGivenTwice(pairs, key)
            seen.add(nfc(key))
    return found


def _refuse_constant(name: str) -> Any:
    return _Unstorable(_("%(name)s is not a JSON number.") % {"name": name})


def _finite_float(text: str) -> float | _Unstorable:
    value = float(text)
    if not math.isfinite(value):
        return _Unstorable(_("The number %(number).40s is too large.") % {"number": text})
    return value


def _bounded_int(text: str) -> int | _Unstorable:
    if len(text) > 20:
        return _Unstorable(_("The integer %(number).40s… is out of range.") % {"number": text})
    value = int(text)
    if not INT_MIN <= value <= INT_MAX:
        return _Unstorable(_("The integer %(number)s is out of range.") % {"number": text})
    return value


def _text_problem(text: str) -> str:
    """Why no database stores ``text`` (PostgreSQL refuses a NUL; no UTF-8 encoder takes a lone surrogate), or ""."""
    if "\x00" in text:
        return _("Text may not contain NUL characters.")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _("Text may not contain unpaired surrogates (\\ud800–\\udfff).")
    return ""


# Where a value is: None for the body itself, else (where its parent is, its key or index).
_Where = tuple[Any, "str | int"] | None
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _path_text(where: _Where) -> str:
    """``where`` as a caller writes it: ``context.userId``, ``a2a_data[0].rows[3]``, ``context["a-b"]``; a key
    that is no identifier quoted as JSON writes it (a NUL as ``\\u0000``), masked, and cut as :func:`shown_text`
    cuts it (a key may be anything the caller sent)."""
    segments: list[str | int] = []
    while where is not None:
        where, segment = where
        segments.append(segment)
    path = ""
    for segment in reversed(segments):
        if isinstance(segment, int):
            path += f"[{segment}]"
            continue
        escaped = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(segment, ensure_ascii=False))
        shown = shown_text(mask_text(escaped[1:-1]))
        if shown == segment and segment.isidentifier():
            path += f".{segment}" if path else segment
        else:
            path += f'["{shown}"]'
    return path


def _first_unstorable(value: Any) -> UnstorableJSON | None:
    """The first problem in ``value`` in the order of the document (a number a hook left, text no database stores,
    an object giving a key twice), placed; None if there is none. Iterative: the depth is already bounded, but a
    walk that recursed would still be a walk of Python frames per level."""
    pending: list[tuple[Any, _Where]] = [(value, None)]
    while pending:
        item, where = pending.pop()
        problem = ""
        if isinstance(item, _Unstorable):
            problem = item.problem
        elif isinstance(item, str):
            problem = _text_problem(item)
        elif isinstance(item, _KeyGivenTwice):
            problem = _('The key "%(key)s" is given twice in one object.') % {"key": shown_text(mask_text(item.key))}
        elif isinstance(item, Mapping):
            members: list[tuple[Any, _Where]] = []
            for key, member in item.items():
                members += [(key, (where, key)), (member, (where, key))]  # a key's problem is placed as its value's
            pending.extend(reversed(members))
        elif isinstance(item, list):
            pending.extend((element, (where, index)) for index, element in reversed(list(enumerate(item))))
        if problem:
            return UnstorableJSON(_path_text(where), problem)
    return None


def json_parse_bounded(raw: bytes, *, max_depth: int, max_values: int | None = None) -> Any:
    """``raw`` (UTF-8 JSON) as Python values. Raises ``ParseError`` (400 ``invalid_json``) for anything the module
    docstring lists (``TooManyJSONValues`` past ``max_values``, by default ``PLATFORM_API_MAX_JSON_ITEMS``), never
    ``RecursionError`` or another exception."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ParseError(_("The body is not UTF-8 text.")) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if max_values is None:
        max_values = int(api_setting("PLATFORM_API_MAX_JSON_ITEMS"))
    outside = _outside_strings(text)
    brackets = _brackets(outside)
    too_many = _values(outside) > max_values
    # Nesting is named first, as it was before values were counted; past the count, only what shows at a glance.
    if (too_many and _deeper_at_a_glance(brackets, max_depth)) or (not too_many and _depth(brackets) > max_depth):
        raise ParseError(_("JSON nested deeper than %(max)d levels.") % {"max": max_depth})
    if too_many:
        raise TooManyJSONValues(_("JSON with more than %(max)d values.") % {"max": max_values})
    try:
        value = json.loads(
            text,
            object_pairs_hook=_object_once,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            parse_int=_bounded_int,
        )
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise ParseError(_("The body is not valid JSON: %(error)s") % {"error": json_error_text(exc)}) from None
    if unstorable := _first_unstorable(value):
        raise unstorable
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
    """DRF's ``JSONParser``, bounded (see the module docstring). Only UTF-8 is accepted (another charset: a 415)."""

    media_type = "application/json"

    def parse(self, stream: IO[bytes] | None, media_type: str | None = None, parser_context: Any = None) -> Any:
        context = parser_context or {}
        # The charset as sent: Django keeps only one Python knows (``request.encoding``), and DRF then reads the
        # body as UTF-8, so ``charset=nonsense`` passed where ``charset=latin-1`` was refused.
        params = getattr(context.get("request"), "content_params", None) or {}
        charset = str(params.get("charset") or context.get("encoding") or "utf-8")
        if charset.lower().replace("_", "-") not in {"utf-8", "utf8"}:
            raise UnsupportedMediaType(
                media_type or self.media_type,
                detail=_("JSON must be UTF-8, not %(charset)s.") % {"charset": shown_text(charset)},
            )
        raw = read_bounded(stream, limit=int(api_setting("PLATFORM_API_MAX_BODY_BYTES")))
        if not raw.strip():
            raise ParseError(_("The body is empty: send a JSON object."))
        try:
            return json_parse_bounded(raw, max_depth=int(api_setting("PLATFORM_API_MAX_JSON_DEPTH")))
        except TooManyJSONValues as exc:
            raise ApplicationError(str(exc.detail), code="too_many_json_values", status=400) from None
        except UnstorableJSON as exc:
            # Placed in ``fields`` as well, as a serializer places what it refuses: a client can point at it.
            fields = {exc.path: [exc.problem]} if exc.path else None
            raise ApplicationError(str(exc.detail), code="invalid_json", status=400, fields=fields) from None
