"""Text as the platform compares it: Korean composed the one way it is stored."""

from __future__ import annotations

import re
import unicodedata
from typing import Any

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


def nfc_value(value: Any) -> Any:
    """``nfc`` for every string of a JSON value (keys too)."""
    if isinstance(value, str):
        return nfc(value)
    if isinstance(value, dict):
        return {nfc(k) if isinstance(k, str) else k: nfc_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [nfc_value(v) for v in value]
    return value
