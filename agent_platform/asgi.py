"""
ASGI config for agent_platform project.

It exposes the ASGI callable as a module-level variable named ``application``.

For more information on this file, see
https://docs.djangoproject.com/en/5.2/howto/deployment/asgi/
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agent_platform.settings")

django_application = get_asgi_application()

from django.conf import settings  # noqa: E402

from agent_platform.body_limit import BodyLimitASGIMiddleware  # noqa: E402  (after Django is set up)
from agent_platform.telemetry import server_log_handlers_adopted  # noqa: E402

# The server's own log lines masked, and JSON under LOG_FORMAT=json (it set up its logging before loading this).
server_log_handlers_adopted(settings.LOG_FORMAT)

# Bodies over the limit are refused before Django's handler reads them into a file (agent_platform/body_limit.py).
application = BodyLimitASGIMiddleware(django_application)
