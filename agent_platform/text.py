"""Text as the platform compares it: Korean composed the one way it is stored."""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Callable
from typing import Any

import regex  # type: ignore[import-untyped]
from django.utils.html import strip_tags
from django.utils.translation import gettext, gettext_lazy

# CJK compatibility ideographs (KS X 1001's duplicate hanja, U+F900–U+FAFF, U+2F800–U+2FA1F): NFC would replace
# each with its unified twin, changing a name written with it. They are kept as written.
_COMPATIBILITY_IDEOGRAPHS = re.compile("([\uf900-\ufaff\U0002f800-\U0002fa1f]+)")


def nfc(text: str) -> str:
    """``text`` in Unicode's composed form (NFC), CJK compatibility ideographs kept as written. Korean typed on
    macOS or iOS, or pasted from a file name, often comes decomposed (NFD: 김 as ᄀ+ᅵ+ᆷ), which reads the same and
    matches nothing written composed: a query, its context and data are stored composed
    (``agents.services.run_input_guarded``), and the rules compare composed text on both sides."""
    if unicodedata.is_normalized("NFC", text):
        return text
    parts = _COMPATIBILITY_IDEOGRAPHS.split(text)  # odd places: the ideographs, kept
    return "".join(part if i % 2 else unicodedata.normalize("NFC", part) for i, part in enumerate(parts))


def plain_text(html_text: str) -> str:
    """A text written as HTML (a page's message with its links) as plain text: a command's line, a report's."""
    return html.unescape(strip_tags(html_text))


def strings_mapped(value: Any, text: Callable[[str], str]) -> Any:
    """A JSON value with ``text`` applied to every string in it, keys too, at any depth."""
    if isinstance(value, str):
        return text(value)
    if isinstance(value, dict):
        return {text(k) if isinstance(k, str) else k: strings_mapped(v, text) for k, v in value.items()}
    if isinstance(value, list):
        return [strings_mapped(v, text) for v in value]
    return value


def nfc_value(value: Any) -> Any:
    """``nfc`` for every string of a JSON value (keys too)."""
    return strings_mapped(value, nfc)


# The messages of ``re`` and ``regex`` (both modules word most of them alike) a person is likely to meet, each
# matched whole, as a phrase in the reader's language; a ``detail`` group is what the message quoted (the escape,
# the range, the group name), shown after the phrase as written.
_REGEX_ERRORS: tuple[tuple[re.Pattern[str], Any], ...] = tuple(
    (re.compile(pattern), phrase)
    for pattern, phrase in (
        (r"unterminated character set", gettext_lazy("a character set [ is not closed with ]")),
        (r"missing \)(?:, unterminated (?:subpattern|comment))?", gettext_lazy("a ( is not closed with )")),
        (r"unbalanced parenthesis", gettext_lazy("a ) closes no group")),
        (r"nothing to repeat", gettext_lazy("a repeat (*, +, ? or {n}) follows nothing it could repeat")),
        (r"multiple repeat", gettext_lazy("a repeat follows another repeat (as in a**)")),
        (r"bad escape \(end of pattern\)", gettext_lazy("the pattern ends with a \\ that escapes nothing")),
        (r"bad escape (?P<detail>.+)", gettext_lazy("unknown escape")),
        (r"unknown extension \?<(?![=!]).*", gettext_lazy("a named group is written (?P<name>…), not (?<name>…)")),
        (r"unknown extension(?: (?P<detail>.+))?", gettext_lazy("unknown (?…) construct")),
        (
            r"bad character range(?: (?P<detail>.+))?",
            gettext_lazy("a character range runs backwards (its first character comes after its last)"),
        ),
        (
            r"look-behind requires fixed-width pattern",
            gettext_lazy("a look-behind must match a fixed number of characters"),
        ),
        (r"min repeat greater than max repeat", gettext_lazy("a repeat's minimum is greater than its maximum")),
        (r"repeat count too big|the repetition number is too large", gettext_lazy("a repeat count is too large")),
        (r"unknown group(?: name (?P<detail>.+))?", gettext_lazy("no group has this name or number")),
        (
            r"bad character in group name(?: (?P<detail>.+))?",
            gettext_lazy("a group name is a letter or _ followed by letters, digits or _"),
        ),
        (
            r"redefinition of group name (?P<detail>.+) as group \d+; was group \d+",
            gettext_lazy("a group name is used twice"),
        ),
        (
            r"global flags not at the start of the expression",
            gettext_lazy("flags such as (?i) must come at the start of the pattern"),
        ),
    )
)


_GRAPHEME = regex.compile(r"\X")


def grapheme_cut(text: str, max_chars: int) -> str:
    """``text`` (composed first: ``nfc``) cut to at most ``max_chars`` characters on a boundary a reader sees: never
    inside a syllable typed decomposed (ᄀ+ᅵ+ᆷ cut after ᅵ reads 기, another syllable than 김), a combining
    sequence or an emoji joined by ZWJ (👩‍💻 cut leaves 👩 and a bare joiner)."""
    text = nfc(text)
    if len(text) <= max_chars:
        return text
    end = 0
    for cluster in _GRAPHEME.finditer(text):
        if cluster.end() > max_chars:
            break
        end = cluster.end()
    return text[:end]


def regex_error_text(exc: BaseException) -> str:
    """Why a pattern did not compile, in the reader's language: an error of ``re`` or ``regex`` as a phrase (with
    what it quoted: ``\\q``, ``z-a``) and where, counted from 1 as a person counts ("at character 3"; ``regex``
    points past a construct it could not close: "at the end of the pattern"). The OverflowError and RecursionError
    the modules raise for a repeat count too large and groups nested too deeply are told too. A message not known
    here is kept as the module wrote it (in English) rather than guessed at."""
    if isinstance(exc, RecursionError):
        return gettext("its groups are nested too deeply")
    message = str(getattr(exc, "msg", None) or exc)
    for pattern, phrase in _REGEX_ERRORS:
        if found := pattern.fullmatch(message):
            detail = found.groupdict().get("detail")
            message = f"{phrase}: {detail}" if detail else str(phrase)
            break
    position, source = getattr(exc, "pos", None), getattr(exc, "pattern", None)
    if not isinstance(position, int):
        return message
    if isinstance(source, str | bytes) and position >= len(source):
        return gettext("%(problem)s (at the end of the pattern)") % {"problem": message}
    return gettext("%(problem)s (at character %(n)d)") % {"problem": message, "n": position + 1}


# The most a regex's counted repeats may multiply to, nested (``((a{1000}){1000}){1000}``): the ``regex`` module
# unrolls them when it compiles, and 25 characters took gigabytes (the rule editor checks as it is typed).
MAX_REPEAT_WEIGHT = 100_000
_COUNTED_REPEAT = re.compile(r"\{([0-9]*)(?:,([0-9]*))?\}")


def repeat_weight(pattern: str) -> int:
    """About how many atoms the ``regex`` module unrolls ``pattern`` into: each atom once, a counted repeat
    (``{n}``, ``{m,n}``) multiplying what it repeats (a group: all its atoms, nested repeats included), atoms
    side by side added up, alternatives (``|``) the largest of them. Read without compiling; it stops counting
    once past ``MAX_REPEAT_WEIGHT``."""
    frames, last, at = [[0, 0]], 0, 0  # per open group: [largest alternative so far, this alternative's total]
    while at < len(pattern):
        char = pattern[at]
        if char == "\\":
            last, at = 1, at + 2
            frames[-1][1] += 1
        elif char == "[":  # a character class is one atom, whatever its brackets and braces
            end = at + 1 + (pattern[at + 1 : at + 2] == "^")
            end += pattern[end : end + 1] == "]"
            while end < len(pattern) and pattern[end] != "]":
                end += 2 if pattern[end] == "\\" else 1
            last, at = 1, end + 1
            frames[-1][1] += 1
        elif char == "(":
            frames.append([0, 0])
            last, at = 0, at + 1
        elif char == ")":
            best, total = frames.pop() if len(frames) > 1 else (0, 1)
            last, at = max(best, total, 1), at + 1
            frames[-1][1] += last
        elif char == "|":
            frames[-1] = [max(frames[-1]), 0]
            last, at = 0, at + 1
        elif char == "{" and (counted := _COUNTED_REPEAT.match(pattern, at)) is not None:
            times = max(int(counted[1] or 0), int(counted[2] or 0), 1)
            frames[-1][1] += last * (times - 1)
            last *= times
            at = counted.end()
        else:
            last, at = 1, at + 1
            frames[-1][1] += 1
        if frames[-1][1] > MAX_REPEAT_WEIGHT:
            return frames[-1][1]
    return max(max(frame) for frame in frames)


def bounded_regex(pattern: str) -> Any:
    """``regex.compile(pattern)``, refused as ``regex`` refuses a repeat count too big where its counted repeats
    would unroll past ``MAX_REPEAT_WEIGHT`` (:func:`repeat_weight`): the module unrolls them as it compiles, and
    25 characters took gigabytes."""
    if repeat_weight(pattern) > MAX_REPEAT_WEIGHT:
        raise regex.error("repeat count too big")
    return regex.compile(pattern)
