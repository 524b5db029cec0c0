"""Django REST framework's own messages that the API's Korean readers meet, worded again in ``locale/ko``.

DRF's Korean catalogue glues a fixed particle to a quoted value (``"APPROVE"은 유효하지 않은 선택입니다``: 은 after a
vowel); the project's catalogue (``LOCALE_PATHS``) is read before an installed package's, so these msgids are
translated there. This module is never imported: ``makemessages`` reads the marks below and keeps the msgids in
the catalogue, with their exact DRF wording (a changed msgid falls back to DRF's own translation)."""

from __future__ import annotations

from django.utils.translation import gettext_noop

DRF_MESSAGES = (
    gettext_noop('"{input}" is not a valid choice.'),
    gettext_noop('Method "{method}" not allowed.'),
    gettext_noop("Invalid data. Expected a dictionary, but got {datatype}."),
    gettext_noop('Unsupported media type "{media_type}" in request.'),
    gettext_noop("This field may not be blank."),
)
