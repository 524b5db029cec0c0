"""The API's settings: ``settings.<NAME>`` where the settings module has it, else the value
``agent_platform.settings_api`` read from the environment (the same one), so the API works with or without the
lines that merge ``settings_api`` into the settings module."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from agent_platform import settings_api


def api_setting(name: str) -> Any:
    return getattr(settings, name, getattr(settings_api, name))
