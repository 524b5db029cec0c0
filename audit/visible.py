"""Text shown to a person who decides on it (an approval's arguments, a tool's changed description): characters
that change how text reads without showing themselves are shown as ``⟦U+202E⟧`` instead, never removed, for the
reader must see that they are there. They are Unicode's format characters (category Cf: direction overrides and
isolates, which make ``invoice‮fdp.exe`` read ``invoiceexe.pdf``; zero-width characters, which make two
different values look alike; the tag characters U+E0020–E007E, invisible ASCII that a model reads) and control
characters other than a line break or a tab (a terminal's escape sequences, a carriage return). Also the other
default-ignorable characters, which show nothing either: the combining grapheme joiner, the Hangul fillers (a
"blank" Korean name), the Khmer and Mongolian ones, the braille blank, the rest of the tag block; and a variation
selector that selects nothing: one after anything but a symbol, a keycap's digit or a CJK ideograph (``❤️``, ``1️⃣``
and a Hanja variant keep theirs), for 256 of them spell any bytes after one emoji, invisibly ("variation-selector
smuggling").

A run of more than :data:`RUN_WRITTEN_ONCE` of one such character is written once with its count
(``⟦U+E0041 ×19000⟧``): written out one by one, a result of a few thousand invisible characters would reach the model
(and the page) many times longer than the cap its size was measured against."""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from typing import Any

_KEPT = frozenset("\n\t")
# Unicode's Default_Ignorable_Code_Point characters that are not of category Cf (those are hidden by category),
# and the braille blank, which shows as a space that is none.
_IGNORABLE_RANGES = (
    (0x034F, 0x034F),  # combining grapheme joiner
    (0x115F, 0x1160),  # Hangul choseong and jungseong fillers
    (0x17B4, 0x17B5),  # Khmer inherent vowels
    (0x180B, 0x180F),  # Mongolian free variation selectors and vowel separator
    (0x2065, 0x2065),
    (0x2800, 0x2800),  # braille pattern blank
    (0x3164, 0x3164),  # Hangul filler
    (0xFFA0, 0xFFA0),  # half-width Hangul filler
    (0xFFF0, 0xFFF8),
    (0xE0000, 0xE00FF),  # the tag block's unassigned rest
    (0xE01F0, 0xE0FFF),
)
_SELECTORS = ((0xFE00, 0xFE0F), (0xE0100, 0xE01EF))


def _within(code: int, ranges: tuple[tuple[int, int], ...]) -> bool:
    return any(low <= code <= high for low, high in ranges)


def _selects(previous: str) -> bool:
    """Whether a variation selector after ``previous`` selects something: a symbol's emoji or text form (``❤️``),
    a keycap's digit (``1️⃣``), a CJK ideograph's variant."""
    if previous in "0123456789#*":
        return True
    category = unicodedata.category(previous)
    return category.startswith("S") or (category == "Lo" and unicodedata.name(previous, "").startswith("CJK "))


def _hidden(character: str, previous: str) -> bool:
    if character in _KEPT:
        return False
    code = ord(character)
    if _within(code, _SELECTORS):
        return not previous or not _selects(previous)
    return unicodedata.category(character) in {"Cf", "Cc"} or _within(code, _IGNORABLE_RANGES)


def _marked(text: str) -> list[bool]:
    """For each character of ``text``, whether it does not show itself (``_hidden``, given the one before it)."""
    return [_hidden(c, text[i - 1] if i else "") for i, c in enumerate(text)]


@functools.cache
def hidden_ranges(*, spaces: bool) -> tuple[tuple[int, int], ...]:
    """The ranges of code points, merged and in order, of every character :func:`_hidden` may find (a variation
    selector whatever comes before it; ``spaces``: a carriage return, a form feed and the other whitespace controls
    too). Built on first use (categories Cf and Cc lie below U+30000 but for the tag block, which
    ``_IGNORABLE_RANGES`` holds)."""
    codes = [
        c
        for c in range(0x30000)
        if unicodedata.category(chr(c)) in {"Cf", "Cc"} and chr(c) not in _KEPT and (spaces or not chr(c).isspace())
    ]
    return merged_ranges([(c, c) for c in codes] + list(_IGNORABLE_RANGES + _SELECTORS))


def merged_ranges(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    merged: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return tuple(merged)


def quick_class(ranges: tuple[tuple[int, int], ...]) -> re.Pattern[str]:
    """A character class of ``ranges`` below U+10000 and of every character above: ``re`` tests a class of
    characters below U+10000 with one look-up, and every range above one by one (five times slower for a text
    without any). A text it finds nothing in holds none of ``ranges``."""
    below = [(low, min(high, 0xFFFF)) for low, high in ranges if low <= 0xFFFF]
    return character_class((*below, (0x10000, 0x10FFFF)))


def character_class(ranges: tuple[tuple[int, int], ...]) -> re.Pattern[str]:
    return re.compile("[" + "".join(f"\\U{low:08X}-\\U{high:08X}" for low, high in ranges) + "]")


@functools.cache
def _maybe_hidden(spaces: bool) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """:func:`hidden_ranges` as a character class, and as :func:`quick_class`: a text the one or the other finds
    nothing in holds no character that hides itself, known at C speed instead of a call per character."""
    ranges = hidden_ranges(spaces=spaces)
    return character_class(ranges), quick_class(ranges)


def hidden_marks(text: str, *, spaces: bool = True) -> list[bool] | None:
    """:func:`_marked` of ``text``, or None where no character of it hides itself (most texts, found at C speed).
    ``spaces=False``: whitespace (a carriage return) counts as shown (``audit.masking`` matches across it apart)."""
    if text.isascii() and text.isprintable():
        return None
    exact, quick = _maybe_hidden(spaces)
    if quick.search(text) is None or exact.search(text) is None:
        return None
    marked = _marked(text)
    if not spaces:
        marked = [hidden and not c.isspace() for c, hidden in zip(text, marked, strict=True)]
    return marked if any(marked) else None


def invisible_characters(text: str) -> list[str]:
    """The characters of ``text`` that do not show themselves, in order of appearance, each once."""
    marked = hidden_marks(text)
    if marked is None:
        return []
    return list(dict.fromkeys(c for c, hidden in zip(text, marked, strict=True) if hidden))


RUN_WRITTEN_ONCE = 3  # a longer run of one hidden character is written once, with its count


def visible_text(text: str) -> str:
    """``text`` with each character that does not show itself written as ``⟦U+XXXX⟧``; a run of more than
    :data:`RUN_WRITTEN_ONCE` of the same one as ``⟦U+XXXX ×N⟧``."""
    marked = hidden_marks(text)
    if marked is None:
        return text
    return _written_out(text, marked)


_ZWJ = "\u200d"


def _pictograph(character: str) -> bool:
    """Whether ``character`` is one an emoji sequence joins (``👩``, ``💻``, ``🌈``; a skin tone, a symbol)."""
    return unicodedata.category(character) in {"So", "Sk"}


def readable_text(text: str) -> str:
    """``text`` as people and models read a tool's value (an answer, a result): what does not show itself written
    out (:func:`visible_text`), but a line's ``\r\n`` end, kept as the line break it is (a lone ``\r``, which can
    hide what came before it, is written out), and a zero-width joiner between two pictographs, which joins an emoji
    (``👩‍💻``, ``🏳️‍🌈``; it read ``👩⟦U+200D⟧💻``)."""
    text = text.replace("\r\n", "\n")
    marked = hidden_marks(text)
    if marked is None:
        return text
    if _ZWJ in text:
        for at in range(1, len(text) - 1):
            if text[at] == _ZWJ and marked[at] and _pictograph(text[at + 1]):
                before = at - 1
                while before > 0 and not marked[before] and text[before] in "\ufe0f\ufe0e":
                    before -= 1  # a selector that selects the pictograph's emoji form
                marked[at] = not _pictograph(text[before])
        if not any(marked):
            return text
    return _written_out(text, marked)


def _written_out(text: str, marked: list[bool]) -> str:
    shown: list[str] = []
    at, end = 0, len(text)
    while at < end:
        character = text[at]
        if not marked[at]:
            shown.append(character)
            at += 1
            continue
        after = at + 1
        while after < end and marked[after] and text[after] == character:
            after += 1
        count, written = after - at, f"U+{ord(character):04X}"
        shown.append(f"⟦{written} ×{count}⟧" if count > RUN_WRITTEN_ONCE else f"⟦{written}⟧" * count)
        at = after
    return "".join(shown)


TOOL_DATA_OPEN = "<tool_data>"
TOOL_DATA_CLOSE = "</tool_data>"


def tool_data_block(value: Any, *, indent: int | None = 2) -> str:
    """``value`` (a tool's result, an error text a tool or server wrote) as JSON inside ``<tool_data>`` markers that
    nothing in it can close: ``<``, ``>`` and ``&`` are written as JSON escapes (``\\u003c``...), so the text stays
    the same data for the model and no tag, marker or delimiter inside it survives as one. Characters that do not
    show themselves are written out (``⟦U+E0049⟧``): tag characters are ASCII a model reads and nobody sees, so the
    data could otherwise carry instructions that no person reading the run or the audit would find. The system
    message's deterministic results (``agents.answers``) and the gate's failure details (``mcpregistry.gate``);
    ``indent=None``: on one line, as a tool's answer reaches the model in its loop (``gate.ToolResult.for_model``:
    indented, a list of small rows grew to two and a half times its size past the result cap)."""
    text = json.dumps(value, ensure_ascii=False, indent=indent, default=str)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f"{TOOL_DATA_OPEN}\n{visible_text(text)}\n{TOOL_DATA_CLOSE}"
