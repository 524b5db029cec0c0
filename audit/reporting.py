"""Django's error reports and debug pages, masked like every other output of the platform."""

from __future__ import annotations

import re
from typing import Any

from django.views.debug import SafeExceptionReporterFilter

from audit.masking import is_secret_key, mask_text, mask_value


class MaskingExceptionReporterFilter(SafeExceptionReporterFilter):
    """Hides settings that carry credentials (``DATABASE_URL``, ``REDIS_URL``, broker URLs, keys) on top of
    Django's own list, and masks secret-looking values in request data and frame variables."""

    hidden_settings = re.compile(
        "API|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|URL|DSN|BROKER|DATABASES|CACHES|LOCATION", flags=re.I
    )

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        cleansed = super().cleanse_setting(key, value)
        return mask_value(cleansed) if isinstance(cleansed, dict | list | str) else cleansed

    def get_post_parameters(self, request: Any) -> Any:
        params = super().get_post_parameters(request)
        if not params:
            return params
        cleansed = params.copy()
        for key in cleansed:
            value = cleansed[key]
            cleansed[key] = self.cleansed_substitute if is_secret_key(key) else mask_text(str(value))
        return cleansed

    def get_traceback_frame_variables(self, request: Any, tb_frame: Any) -> Any:
        return [
            (name, mask_text(str(value))) for name, value in super().get_traceback_frame_variables(request, tb_frame)
        ]
