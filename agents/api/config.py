"""The API's settings, read through ``django.conf.settings`` only.

Their defaults (from the environment) are in ``agent_platform/settings_api.py``, which the settings module
merges; a settings module without them fails loudly here (``AttributeError`` naming the setting) rather than
running with values nobody configured.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings


def api_setting(name: str) -> Any:
    """``settings.<name>``. Read at call time, so a test's ``settings`` fixture (or an override) applies."""
    return getattr(settings, name)
