"""Text shown to a person who decides on it (an approval's arguments, a tool's changed description): characters
that change how text reads without showing themselves are shown as ``⟦U+202E⟧`` instead, never removed, for the
reader must see that they are there. They are Unicode's format characters (category Cf: direction overrides and
isolates, which make ``invoice‮fdp.exe`` read ``invoiceexe.pdf``; zero-width characters, which make two
different values look alike; the tag characters U+E0020–E007E, invisible ASCII that a model reads) and control
characters other than a line break or a tab (a terminal's escape sequences, a carriage return)."""

from __future__ import annotations

import unicodedata

_KEPT = frozenset("\n\t")


def _hidden(character: str) -> bool:
    return character not in _KEPT and unicodedata.category(character) in {"Cf", "Cc"}


def invisible_characters(text: str) -> list[str]:
    """The characters of ``text`` that do not show themselves, in order of appearance, each once."""
    if text.isascii() and text.isprintable():
        return []
    return list(dict.fromkeys(c for c in text if _hidden(c)))


def visible_text(text: str) -> str:
    """``text`` with each character that does not show itself written as ``⟦U+XXXX⟧``."""
    if (text.isascii() and text.isprintable()) or not invisible_characters(text):
        return text
    return "".join(f"⟦U+{ord(c):04X}⟧" if _hidden(c) else c for c in text)
