# syntax=docker/dockerfile:1
#
# One image for every process of the agent platform:
#   web     gunicorn + uvicorn workers serving agent_platform.asgi:application (ASGI, because the API
#           streams server-sent events)
#   worker  celery -A agent_platform worker (it also spawns the stdio demo MCP server,
#           `python -m mcpregistry.demo_server`, so the image carries the project code and Python)
#
# Build:  docker build -t agent-platform:local .
# Run:    see docker-compose.yml; every setting comes from environment variables.

FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONPATH=/app \
    DJANGO_SETTINGS_MODULE=agent_platform.settings

WORKDIR /app

# Unprivileged runtime user with a real home (some libraries write caches under $HOME).
RUN groupadd --system --gid 10001 app \
 && useradd --system --uid 10001 --gid app --create-home --home-dir /home/app --shell /usr/sbin/nologin app

# Dependencies first, so code edits do not invalidate this layer. Only what the platform runs: the tests' and
# tools' packages (requirements-dev.txt) stay out of the image.
# gunicorn and uvicorn serve the ASGI app; they are installed at the pinned versions below only when
# requirements.txt does not already bring them (so a pin there always wins).
# uvicorn 0.54 still ships the (deprecated) `uvicorn.workers.UvicornWorker` gunicorn worker class;
# the import check below fails the build early if a future pin removes it (then switch the compose
# command to the `uvicorn-worker` package's `uvicorn_worker.UvicornWorker`, or to plain uvicorn).
COPY requirements.txt ./
RUN pip install --no-cache-dir -r requirements.txt \
 && { python -c "import gunicorn" 2>/dev/null || pip install --no-cache-dir gunicorn==23.0.0; } \
 && { python -c "import uvicorn" 2>/dev/null || pip install --no-cache-dir uvicorn==0.54.0; } \
 && python -W ignore -c "import gunicorn, uvicorn.workers"

# Application code stays owned by root (read-only for the app user). Only the directories the
# processes write to are handed to it:
#   /app/staticfiles  STATIC_ROOT, filled by `collectstatic` at web start-up (deploy/entrypoint.sh)
#   /app/var          PLATFORM_VAR_DIR; settings create it on import
COPY . .
RUN chmod 0755 /app/deploy/entrypoint.sh \
 && mkdir -p /app/staticfiles /app/var \
 && chown app:app /app/staticfiles /app/var

USER app

EXPOSE 8000

# No HEALTHCHECK here: web and worker share this image but need different probes; docker-compose.yml
# defines one per service.

ENTRYPOINT ["/app/deploy/entrypoint.sh"]
# gunicorn.conf.py: the server's own log lines (boot, errors, the access log) as the platform's (LOG_FORMAT=json:
# one JSON object each), masked.
CMD ["gunicorn", "agent_platform.asgi:application", \
     "--config", "/app/gunicorn.conf.py", \
     "--worker-class", "uvicorn.workers.UvicornWorker", \
     "--bind", "0.0.0.0:8000", \
     "--timeout", "120", "--graceful-timeout", "30"]
