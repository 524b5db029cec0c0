#!/usr/bin/env bash
# Container entrypoint for the agent platform image (web and worker).
#
#   1. waits until the database accepts connections (DB_WAIT_TIMEOUT seconds, default 60;
#      SKIP_DB_WAIT=1 skips the wait); each attempt gives up after DB_CONNECT_TIMEOUT seconds (the
#      settings' connect_timeout, default 5), so a database that accepts connections and never
#      answers ends the wait at its deadline too,
#   2. when RUN_MIGRATIONS=1 (set on the web service only): `migrate --noinput`, then
#      `collectstatic --noinput` into STATIC_ROOT (RUN_COLLECTSTATIC=0 skips that part),
#   3. execs the command, replacing this shell so the server itself receives SIGTERM on stop.
set -euo pipefail

export DJANGO_SETTINGS_MODULE="${DJANGO_SETTINGS_MODULE:-agent_platform.settings}"

log() { printf 'entrypoint: %s\n' "$*" >&2; }

if [[ "${SKIP_DB_WAIT:-0}" != "1" ]]; then
    log "waiting for the database (up to ${DB_WAIT_TIMEOUT:-60}s)"
    python - <<'PY'
import os
import sys
import time

import django

django.setup()

from django.db import connections
from django.db.utils import Error as DatabaseError

timeout = float(os.environ.get("DB_WAIT_TIMEOUT") or 60)
deadline = time.monotonic() + timeout
while True:
    conn = connections["default"]
    try:
        conn.ensure_connection()
    except DatabaseError as exc:
        if time.monotonic() >= deadline:
            print(f"entrypoint: database still unreachable after {timeout:.0f}s: {exc}", file=sys.stderr)
            sys.exit(1)
        time.sleep(1)
    else:
        conn.close()
        break
print("entrypoint: database is up", file=sys.stderr)
PY
fi

if [[ "${RUN_MIGRATIONS:-0}" == "1" ]]; then
    log "applying migrations"
    python manage.py migrate --noinput
    if [[ "${RUN_COLLECTSTATIC:-1}" == "1" ]]; then
        log "collecting static files"
        python manage.py collectstatic --noinput
    fi
fi

if [[ $# -eq 0 ]]; then
    log "no command given"
    exit 64
fi

exec "$@"
