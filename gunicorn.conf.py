"""gunicorn's settings for the web process (the image's command and docker-compose.yml's name it with ``--config``).

The server's own log lines (gunicorn's boot, worker and error lines, uvicorn's errors and its access log, one line
per request) go through the platform's logging: with ``LOG_FORMAT=json`` each is one JSON object, as the
application's are (``agent_platform.telemetry.JsonLogFormatter``), and in either format every one passes the
platform's secret masking (``audit.masking.SecretMaskingFilter``: a token in a query string, say). Errors go to
stderr and the access log to stdout, as gunicorn's own defaults. ``LOG_LEVEL`` sets the level of the error lines.

The rest (bind, workers, timeouts, the worker class) stays on the command line.
"""

from __future__ import annotations

import os

# uvicorn's worker believes X-Forwarded-For from the addresses listed here (gunicorn's default: loopback) and
# rewrites the client's address before the platform sees it: none, so that the platform alone decides which
# forwarded headers to believe (PLATFORM_PROXY_HOPS, PLATFORM_TRUSTED_PROXIES); a client could otherwise dodge its
# login lockout with a new forged address each time, and have that address audited.
forwarded_allow_ips = ""

# One line per request on stdout (uvicorn's worker writes it through the ``gunicorn.access`` handlers below).
accesslog = "-"
errorlog = "-"

_JSON = os.environ.get("LOG_FORMAT", "plain").strip().lower() == "json"
_LEVEL = os.environ.get("LOG_LEVEL", "INFO").strip().upper() or "INFO"


def _handler(stream: str, formatter: str) -> dict[str, object]:
    return {
        "class": "logging.StreamHandler",
        "formatter": "json" if _JSON else formatter,
        "filters": ["mask_secrets"],
        "stream": stream,
    }


logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"mask_secrets": {"()": "audit.masking.SecretMaskingFilter"}},
    "formatters": {
        "json": {"()": "agent_platform.telemetry.JsonLogFormatter"},
        # gunicorn's own formats.
        "generic": {
            "format": "%(asctime)s [%(process)d] [%(levelname)s] %(message)s",
            "datefmt": "[%Y-%m-%d %H:%M:%S %z]",
            "class": "logging.Formatter",
        },
        "access": {"format": "%(message)s", "class": "logging.Formatter"},
    },
    "handlers": {
        "error_console": _handler("ext://sys.stderr", "generic"),
        "access_console": _handler("ext://sys.stdout", "access"),
    },
    "root": {"level": _LEVEL, "handlers": ["error_console"]},
    "loggers": {
        "gunicorn.error": {"level": _LEVEL, "handlers": ["error_console"], "propagate": False},
        "gunicorn.access": {"level": "INFO", "handlers": ["access_console"], "propagate": False},
        # uvicorn's worker hands these gunicorn's handlers above; named too for a uvicorn logger used before that.
        "uvicorn": {"level": _LEVEL, "handlers": ["error_console"], "propagate": False},
        "uvicorn.error": {"level": _LEVEL, "handlers": ["error_console"], "propagate": False},
        "uvicorn.access": {"level": "INFO", "handlers": ["access_console"], "propagate": False},
    },
}
