"""Korean pages write dates as the English ones do (``agent_platform/formats/en/formats.py``)."""

from agent_platform.formats.en.formats import (  # noqa: F401 - Django reads these names from this module
    DATE_FORMAT,
    DATETIME_FORMAT,
    SHORT_DATE_FORMAT,
    SHORT_DATETIME_FORMAT,
    TIME_FORMAT,
)
