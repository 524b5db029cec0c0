"""A list of texts as an admin writes it: comma-separated words (keywords, tags) or a line each (questions, a
command's arguments), never a JSON list to type. A JSON list is still read (a text starting with ``[``), and a
stored list the separator cannot carry (a word with a comma, an argument with a line break, a first item that
starts with ``[``) is shown as JSON, so opening and saving a page never changes what is stored.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.utils.translation import gettext


class TextListField(forms.CharField):
    """``["프린터", "노트북"]`` ⇄ ``프린터, 노트북`` (``separator=","``) or a line each (``separator="\\n"``)."""

    def __init__(
        self,
        *,
        separator: str = ",",
        unique: bool = False,
        keep_blanks: bool = False,
        encoder: Any = None,
        decoder: Any = None,
        **kwargs: Any,
    ) -> None:
        self.separator, self.unique, self.keep_blanks = separator, unique, keep_blanks
        if "widget" not in kwargs:
            kwargs["widget"] = (
                forms.TextInput(attrs={"size": 80})
                if separator == ","
                else forms.Textarea(attrs={"rows": 4, "cols": 80})
            )
        kwargs.pop("max_length", None)
        super().__init__(strip=False, **kwargs)

    def _carries(self, items: list[str]) -> bool:
        """Whether the separated text reads back as exactly these items."""
        if any(self.separator in item or (self.separator == "," and "\n" in item) for item in items):
            return False
        if items and items[0].lstrip().startswith("["):
            return False
        return all(item == item.strip() and (item or self.keep_blanks) for item in items)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, str) or value is None:
            return value or ""
        if isinstance(value, list) and all(isinstance(item, str) for item in value) and self._carries(value):
            return (", " if self.separator == "," else "\n").join(value)
        return json.dumps(value, ensure_ascii=False)

    def to_python(self, value: Any) -> list[str]:
        if isinstance(value, list):
            return value
        text = str(value or "")
        if text.strip().startswith("["):
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = None
            if not isinstance(parsed, list) or not all(isinstance(item, str) for item in parsed):
                raise forms.ValidationError(self.refusal(), code="invalid")
            return parsed
        items = [item.strip() for item in text.split(self.separator)]
        items = [item for item in items if item]
        return list(dict.fromkeys(items)) if self.unique else items

    def refusal(self) -> str:
        if self.separator == ",":
            return gettext("Write the words separated by commas (or as a JSON list of texts).")
        return gettext("Write one per line (or a JSON list of texts).")

    def validate(self, value: Any) -> None:
        if self.required and not value:
            raise forms.ValidationError(self.error_messages["required"], code="required")

    def has_changed(self, initial: Any, data: Any) -> bool:
        try:
            return self.to_python(data) != (initial or [])
        except forms.ValidationError:
            return True
