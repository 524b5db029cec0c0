"""Text shown to a person who decides on it (an approval's arguments, a tool's changed description): characters
that change how text reads without showing themselves are shown as ``⟦U+202E⟧`` instead, never removed, for the
reader must see that they are there. They are Unicode's format characters (category Cf: direction overrides and
isolates, which make ``invoice‮fdp.exe`` read ``invoiceexe.pdf``; zero-width characters, which make two
different values look alike; the tag characters U+E0020–E007E, invisible ASCII that a model reads) and control
characters other than a line break or a tab (a terminal's escape sequences, a carriage return)."""

from __future__ import annotations

import json
import unicodedata
from typing import Any

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


TOOL_DATA_OPEN = "<tool_data>"
TOOL_DATA_CLOSE = "</tool_data>"


def tool_data_block(value: Any) -> str:
    """``value`` (a tool's result, an error text a tool or server wrote) as JSON inside ``<tool_data>`` markers that
    nothing in it can close: ``<``, ``>`` and ``&`` are written as JSON escapes (``\\u003c``...), so the text stays
    the same data for the model and no tag, marker or delimiter inside it survives as one. Characters that do not
    show themselves are written out (``⟦U+E0049⟧``): tag characters are ASCII a model reads and nobody sees, so the
    data could otherwise carry instructions that no person reading the run or the audit would find. The system
    message's deterministic results (``agents.answers``) and the gate's failure details (``mcpregistry.gate``)."""
    text = json.dumps(value, ensure_ascii=False, indent=2, default=str)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f"{TOOL_DATA_OPEN}\n{visible_text(text)}\n{TOOL_DATA_CLOSE}"
