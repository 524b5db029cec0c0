"""Settings for the agent platform, read from the environment.

Defaults are for one machine with nothing installed but Python: SQLite and a Celery broker on kombu's
``filesystem://`` transport, both under ``var/``. ``DATABASE_URL`` switches to PostgreSQL and
``CELERY_BROKER_URL`` / ``REDIS_URL`` to Redis. ``DEBUG`` is off unless set.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from django.utils.translation import gettext_lazy as _

from agent_platform.key_files import key_file
from agent_platform.settings_deploy import _env_float, _env_int

# A number variable's bound refuses only the values that never worked; one read without a bound is one whose
# negative values always meant what its 0 means (off, at once, one by one), and a deployment may still set them.

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_or_default(name: str, default: str | Path) -> str:
    """The variable's value, or ``default`` where it is unset, empty or only spaces, as for the number variables
    (``PLATFORM_VAR_DIR=`` made the current directory the platform's folder; ``TIME_ZONE=`` stopped every command)."""
    value = os.environ.get(name, "")
    return value if value.strip() else str(default)


# Absolute: the paths made from it are recorded (an archive's file in its checkpoint) and opened again by other
# processes, which may run from another working directory.
VAR_DIR = Path(_env_or_default("PLATFORM_VAR_DIR", BASE_DIR / "var")).resolve()
# The platform's own files (database, keys, broker messages, logs) are this user's alone: folders 0700, files
# 0600, whatever the shell's umask.
os.umask(0o077)
VAR_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
VAR_DIR.chmod(0o700)


def _env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def _env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def _check_networks(name: str, entries: list[str]) -> None:
    """Stops the settings at an entry that is no address or network, naming the variable and the entry (where the
    list is used, a malformed entry would only ever fail to match: whom it was meant to let in is refused, unsaid)."""
    for entry in entries:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name}: {entry!r} is not a network ({exc})") from None


# Without SECRET_KEY, a key generated once for this machine's use (``check --deploy`` warns: audit.W002).
SECRET_KEY_FILE = VAR_DIR / "secret_key"


def _local_secret_key() -> str:
    """Generate a secret key once for local use, kept in a git-ignored file under var/."""
    return key_file(SECRET_KEY_FILE, lambda: secrets.token_urlsafe(50))


DEBUG = _env_bool("DEBUG")
SECRET_KEY = os.environ.get("SECRET_KEY") or _local_secret_key()
ALLOWED_HOSTS = _env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
CSRF_TRUSTED_ORIGINS = _env_list("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "mcpregistry",
    "agents",
    "audit",
    "auditor",
    "evals",
]

# Configuration-as-code sections that apps above agents add (agents/configuration.py config_sections).
PLATFORM_CONFIG_SECTIONS = {"eval_sets": "evals.configuration"}

MIDDLEWARE = [
    # Outermost: any error under /api/ leaves as the API's JSON; then bodies over the limit are refused before
    # sessions, CSRF or authentication read them (agent_platform/body_limit.py).
    "agent_platform.body_limit.ApiErrorShapeMiddleware",
    # Forwarded headers are believed only from PLATFORM_TRUSTED_PROXIES (agent_platform/client_ip.py).
    "agent_platform.client_ip.ForwardedHeadersMiddleware",
    # A trace span per request (a no-op unless the OTEL_* variables turn traces on: agent_platform/telemetry.py).
    "agent_platform.telemetry.TracingMiddleware",
    "agent_platform.body_limit.BodyLimitMiddleware",
    # /healthz and /readyz answered whatever the Host (a kubelet's probe names the pod's IP), before anything below
    # checks it against ALLOWED_HOSTS (agent_platform/probe_middleware.py).
    "agent_platform.probe_middleware.ProbeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    # A NUL in a page's path or query (which no database stores): a 400 page in the reader's language, before any
    # view filters by it (the API's paths are refused above, as JSON: agent_platform/query_guard.py).
    "agent_platform.query_guard.QueryGuardMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # An admin list whose filter value the database cannot hold: the list without filters, not a 500.
    "agent_platform.admin_filters.AdminFilterOverflowMiddleware",
]

ROOT_URLCONF = "agent_platform.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # The project's own admin templates (the dashboard at /admin/), before the apps' and Django's.
        "DIRS": [BASE_DIR / "agent_platform" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "agent_platform.wsgi.application"
ASGI_APPLICATION = "agent_platform.asgi.application"

# --- database -----------------------------------------------------------------------------------
DATABASE_URL = os.environ.get("DATABASE_URL", "")
# How long opening a PostgreSQL connection may take (seconds, 2 to 300; libpq waits at least 2): without a limit, a
# database that accepts the connection and never answers holds every request, /readyz and the entrypoint's wait
# for it forever.
_db_connect_timeout = os.environ.get("DB_CONNECT_TIMEOUT", "").strip() or "5"
if not (_db_connect_timeout.isascii() and _db_connect_timeout.isdigit() and 2 <= int(_db_connect_timeout) <= 300):
    raise ImproperlyConfigured(
        f"DB_CONNECT_TIMEOUT must be a whole number of seconds from 2 to 300, not {_db_connect_timeout!r}"
    )
DB_CONNECT_TIMEOUT = int(_db_connect_timeout)
# How long a connection is kept across requests (seconds; 0 or less: one per request, Django closing a connection
# whose age is past it).
_db_conn_max_age = _env_int("DB_CONN_MAX_AGE", 0)
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=_db_conn_max_age, conn_health_checks=True)}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        # Parameters bound on the server (psycopg's C dumpers, instead of quoting every value into the SQL text in
        # Python), and a statement run DB_PREPARE_THRESHOLD times on a connection prepared there (parsed and
        # planned once): a run's dozen statements are the same every run. Behind a pooler in transaction mode
        # (PgBouncer before 1.21) set DB_PREPARE_THRESHOLD=0 (or any value below: never prepared);
        # DB_SERVER_SIDE_BINDING=0 binds in Python again.
        _prepare_threshold = _env_int("DB_PREPARE_THRESHOLD", 5)
        DATABASES["default"].setdefault("OPTIONS", {}).update(
            server_side_binding=_env_bool("DB_SERVER_SIDE_BINDING", default=True),
            prepare_threshold=_prepare_threshold if _prepare_threshold > 0 else None,
        )
        # A connect_timeout in DATABASE_URL's query wins.
        DATABASES["default"]["OPTIONS"].setdefault("connect_timeout", DB_CONNECT_TIMEOUT)
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("SQLITE_PATH", str(VAR_DIR / "db.sqlite3")),
            # Opening a connection costs more than most requests' queries (the file, its PRAGMAs, Django's SQL
            # functions): under WSGI keep one per thread (DB_CONN_MAX_AGE seconds); under ASGI keep 0.
            "CONN_MAX_AGE": _db_conn_max_age,
            "CONN_HEALTH_CHECKS": True,
            # The web process and the worker write the same file: wait for locks instead of failing,
            # and take the write lock at BEGIN so two writers never deadlock on an upgrade.
            "OPTIONS": {
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            "TEST": {"NAME": os.environ.get("SQLITE_TEST_PATH", str(VAR_DIR / "test_db.sqlite3"))},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# --- i18n: English source text, Korean shipped ---------------------------------------------------
LANGUAGES = [("en", _("English")), ("ko", _("Korean"))]
# The language of LANGUAGE_CODE's first subtag (ko-KR: ko) where the platform has it, English otherwise: an
# empty or unknown one stopped every command in django.setup (no translation files for it).
LANGUAGE_CODE = (os.environ.get("LANGUAGE_CODE") or "en").strip().lower().replace("_", "-").split("-")[0]
if LANGUAGE_CODE not in {code for code, _name in LANGUAGES}:
    LANGUAGE_CODE = "en"
# Dates in every list and page as the run trace and the audit write them (2026-12-04 00:30:24 KST), in both
# languages (agent_platform/formats/).
FORMAT_MODULE_PATH = ["agent_platform.formats"]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = _env_or_default("TIME_ZONE", "Asia/Seoul").strip()  # no zone's name has spaces around it
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", BASE_DIR / "staticfiles"))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# --- REST API -----------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["agents.api.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["agents.api.parsers.BoundedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["agents.api.renderers.UnicodeJSONRenderer"],
    "EXCEPTION_HANDLER": "agents.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
    # ``?format=`` is not DRF's renderer switch here (an unknown one made an existing run a 404): the API speaks
    # JSON, and the auditors' exports read ``format`` themselves.
    "URL_FORMAT_OVERRIDE": None,
}

# --- Celery -------------------------------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "")
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL") or REDIS_URL or "filesystem://"
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = VAR_DIR / "broker"
    # kombu's filesystem transport with atomic writes and takes (agent_platform/embedded_broker.py).
    CELERY_BROKER_TRANSPORT = "agent_platform.embedded_broker:Transport"
    for _sub in ("queue", "processed", "control"):
        (_broker_dir / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        # Exchange tables and broadcast (pidbox) queues; kombu's default is ``control/`` in the working directory.
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
        # How often an idle worker looks for a message (kombu's default, 1 s, is a second's wait per run).
        "polling_interval": _env_float("PLATFORM_BROKER_POLL_S", 0.01, above=0),
    }
else:
    # Longer than any run's hard time limit, so an unacknowledged run is not redelivered while it still runs.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
    if CELERY_BROKER_URL.startswith("redis://"):
        # kombu's Redis transport keeping one client per channel (agent_platform/redis_broker.py).
        CELERY_BROKER_TRANSPORT = "agent_platform.redis_broker:Transport"
# A Redis broker that accepts connections and then never answers (frozen, a stuck proxy, a failover behind a NAT)
# must not hold a publish, a worker or /readyz forever: redis-py waits without limit unless kombu passes these on
# (Celery's broker_connection_timeout does not reach the Redis socket). A command's answer may take this long:
# far above a worker's BRPOP (kombu's brpop_timeout, 1 s, the longest a healthy Redis takes to answer one; its reads
# wait in the event loop, not on the socket) and a slow fsync's stall. Not for other transports.
BROKER_REDIS_SOCKET_OPTIONS = (
    {"socket_connect_timeout": 5.0, "socket_timeout": 10.0}
    if CELERY_BROKER_URL.split("://", 1)[0] in {"redis", "rediss", "sentinel", "redis+socket"}
    else {}
)
# Runs are polled from the database; Celery keeps no copy of results or arguments beyond ids.
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_ALWAYS_EAGER = _env_bool("CELERY_TASK_ALWAYS_EAGER")
# How a run's waiters (?wait, the event stream, the admin's live view) learn that it changed (agents/run_wakeup.py):
# auto (Redis pub/sub where Redis is set, PostgreSQL LISTEN/NOTIFY on PostgreSQL, else a short adaptive poll),
# redis, postgres or poll.
PLATFORM_RUN_WAKEUP = os.environ.get("PLATFORM_RUN_WAKEUP", "auto")
# A polling waiter's first pause; later ones grow to a tenth of the time waited (at most the caller's interval). 0 or
# less: every pause is a tenth of the time waited, which grows with each poll (never a loop that does not pause).
PLATFORM_RUN_WAIT_MIN_POLL_S = _env_float("PLATFORM_RUN_WAIT_MIN_POLL_S", 0.005)
# On Redis, how long the wake-ups of a run's intermediate events (for its event streams and live views) gather
# after the first before they go out together, each run once (0 or less: at once).
PLATFORM_RUN_EVENT_WAKEUP_GATHER_S = _env_float("PLATFORM_RUN_EVENT_WAKEUP_GATHER_S", 0.01)

# --- platform -----------------------------------------------------------------------------------
# Runs a Celery task inline in the web process (tests of services only; never in production).
PLATFORM_DEMO_SERVER_MODULE = "mcpregistry.demo_server"
# Modules whose local tools a ``local`` binding may name (mcpregistry/local_tools.py): a binding's dotted paths
# must lie under one of these, checked before anything is imported (importing runs code).
PLATFORM_LOCAL_TOOL_MODULES = _env_list("PLATFORM_LOCAL_TOOL_MODULES", "mcpregistry.builtin_tools")
# The server the shipped flow templates (agents/flows) call when an agent's flow options name none.
PLATFORM_FLOW_DEFAULT_MCP_ID = os.environ.get("PLATFORM_FLOW_DEFAULT_MCP_ID", "sds-company-data")
# Flow graphs (dotted paths of build_graph functions) offered in the agent form besides the shipped templates.
PLATFORM_FLOW_GRAPHS = [p.strip() for p in os.environ.get("PLATFORM_FLOW_GRAPHS", "").split(",") if p.strip()]
# The most tool calls a flow agent's run makes (each pass; agents/engine.py, _execute_flow): the call past it is not
# made and the run fails as flow:too_many_calls. The shipped templates make one to three; a flow that loops on its
# calls would otherwise write an audit event, a run event and a trace entry for each until its time limit.
PLATFORM_FLOW_MAX_CALLS = _env_int("PLATFORM_FLOW_MAX_CALLS", 200, at_least=1)
# The most tool calls one model turn makes (agents/engine.py): the turn's later calls are not sent, refused to the
# model as tool:too_many_calls (audited), which asks for fewer at once.
PLATFORM_MAX_TOOL_CALLS_PER_TURN = _env_int("PLATFORM_MAX_TOOL_CALLS_PER_TURN", 20, at_least=1)
# The longest timeout a tool contract may set (seconds); a contract's timeout must be > 0 and at most this.
PLATFORM_TOOL_TIMEOUT_MAX_S = _env_float("PLATFORM_TOOL_TIMEOUT_MAX_S", 3600.0, above=0)
# A pooled MCP session idle for longer than this is closed (0 or less: as soon as the reaper sees it idle).
PLATFORM_MCP_IDLE_CLOSE_S = _env_float("PLATFORM_MCP_IDLE_CLOSE_S", 300.0)
# Each worker pool process opens the shared sessions of the servers enabled agents use as it starts (in the
# background), so that the first run does not wait for a stdio server to start (agent_platform/celery.py).
PLATFORM_MCP_OPEN_AT_START = _env_bool("PLATFORM_MCP_OPEN_AT_START", default=True)
PLATFORM_RUN_QUERY_MAX_CHARS = _env_int("PLATFORM_RUN_QUERY_MAX_CHARS", 8000, at_least=1)
PLATFORM_AUDIT_RESULT_MAX_CHARS = _env_int("PLATFORM_AUDIT_RESULT_MAX_CHARS", 20000, at_least=0)
# A tool result longer than this (its text, else its structured content as JSON) is refused by the gate as
# ``result:too_big`` before it reaches the model, the run or the API; a contract's ``returns.max_chars`` overrides it.
PLATFORM_TOOL_RESULT_MAX_CHARS = _env_int("PLATFORM_TOOL_RESULT_MAX_CHARS", 20000, at_least=1)
# Shadow runs (agents/shadow.py) go to this Celery queue (empty: the default one). Give it a worker of its own
# (``celery worker -Q shadow``) so that live runs never wait behind shadow runs.
PLATFORM_SHADOW_QUEUE = os.environ.get("PLATFORM_SHADOW_QUEUE", "")

# Independent read calls of one model turn run concurrently through the gate: at most this many at once per run
# (1 or less: one by one) and at most the second number at once on one server (agents/parallel_calls.py). The second
# is read only where calls run at once: there 0 would hold every call waiting for a server's slot forever.
PLATFORM_PARALLEL_TOOL_CALLS = _env_int("PLATFORM_PARALLEL_TOOL_CALLS", 4)
PLATFORM_PARALLEL_TOOL_CALLS_PER_SERVER = _env_int(
    "PLATFORM_PARALLEL_TOOL_CALLS_PER_SERVER", 2, at_least=1 if PLATFORM_PARALLEL_TOOL_CALLS >= 2 else None
)

# --- the embedding tool ranker (mcpregistry/embeddings.py): an OpenAI-compatible /embeddings endpoint, or Bedrock
# (``bedrock:<model id>``, credentials from the standard AWS chain). Empty: the embedding ranker is unavailable
# and agents that ask for it are ranked lexically (the trace says so).
PLATFORM_EMBEDDINGS_URL = os.environ.get("PLATFORM_EMBEDDINGS_URL", "")
PLATFORM_EMBEDDINGS_MODEL = os.environ.get("PLATFORM_EMBEDDINGS_MODEL", "")
PLATFORM_EMBEDDINGS_TIMEOUT_S = _env_float("PLATFORM_EMBEDDINGS_TIMEOUT_S", 10.0, above=0)

# --- the audit chain's authentication and anchors (audit/chain_keys.py, audit/anchors.py) -------
# Comma-separated keys, 32+ characters each: the first signs, all verify. Never in the database. Without
# it, a local key is generated once into AUDIT_CHAIN_KEY_FILE (mode 0600).
AUDIT_CHAIN_KEY = _env_list("AUDIT_CHAIN_KEY")
AUDIT_CHAIN_KEY_FILE = Path(_env_or_default("AUDIT_CHAIN_KEY_FILE", VAR_DIR / "audit_chain_key"))
# Where `audit_anchor` writes the chain head: an append-only JSONL file, or, where a bucket is named, objects
# under object lock in an S3-compatible bucket (credentials from the standard AWS chain).
AUDIT_ANCHOR_PATH = Path(_env_or_default("AUDIT_ANCHOR_PATH", VAR_DIR / "audit_anchors.jsonl"))
AUDIT_ANCHOR_S3_BUCKET = os.environ.get("AUDIT_ANCHOR_S3_BUCKET", "")
AUDIT_ANCHOR_S3_PREFIX = os.environ.get("AUDIT_ANCHOR_S3_PREFIX", "audit-anchors/")
AUDIT_ANCHOR_S3_ENDPOINT_URL = os.environ.get("AUDIT_ANCHOR_S3_ENDPOINT_URL") or None
AUDIT_ANCHOR_S3_REGION = os.environ.get("AUDIT_ANCHOR_S3_REGION") or None
AUDIT_ANCHOR_S3_LOCK_MODE = os.environ.get("AUDIT_ANCHOR_S3_LOCK_MODE", "COMPLIANCE")
AUDIT_ANCHOR_S3_RETENTION_DAYS = _env_int("AUDIT_ANCHOR_S3_RETENTION_DAYS", 2557, at_least=1)
# Every worker anchors the head this often (seconds; 0 or less turns the worker's timer off).
AUDIT_ANCHOR_INTERVAL_S = _env_float("AUDIT_ANCHOR_INTERVAL_S", 300.0)
# How events join the chain (audit/services.py): "deferred" (an append inserts a MAC'd pending row, and a single
# chainer links pending rows into the chain in order just after commit: no writer holds the chain head for its
# transaction), "inline" (every append locks the head for the rest of its transaction), or "auto" (the default:
# deferred on PostgreSQL, inline on SQLite, whose one write lock serialises writers anyway).
AUDIT_CHAIN_MODE = os.environ.get("AUDIT_CHAIN_MODE", "auto")
# Every worker chains what crashed writers left pending this often (seconds; 0 or less turns the worker's timer off).
AUDIT_CHAIN_INTERVAL_S = _env_float("AUDIT_CHAIN_INTERVAL_S", 5.0)
# Deferred: a committed append wakes its process's chainer thread ("on"; "auto", the default, means on PostgreSQL)
# rather than chaining before on_commit returns ("off"): a lone writer then pays one insert and one commit.
AUDIT_CHAIN_BACKGROUND = os.environ.get("AUDIT_CHAIN_BACKGROUND", "auto")
# How long the chainer thread, woken by a commit, lets further commits gather before its pass (seconds): a run's
# few appends are chained in one pass after it rather than in one pass each while it runs (the pass shares the
# worker's interpreter with the run).
AUDIT_CHAIN_GATHER_S = _env_float("AUDIT_CHAIN_GATHER_S", 0.05, at_least=0)
# How long at most the chainer thread lets the runs its worker process is executing go first before its pass
# (seconds; audit.services.audit_chain_held_off): a pass in the middle of a run cost a PostgreSQL run a quarter of
# its time. The chain's lag grows by at most as much (0 or less: the pass does not wait).
AUDIT_CHAIN_HOLD_OFF_S = _env_float("AUDIT_CHAIN_HOLD_OFF_S", 1.0)
# A write of a configuration model outside the services (which audit it) is refused ("refuse"); the test
# suite sets "tests", which also lets test code itself create fixtures directly (audit/change_guard.py).
# Fernet keys for bindings' secrets at rest, comma-separated; the first encrypts (mcpregistry/crypto.py).
SECRETS_ENCRYPTION_KEYS = os.environ.get("SECRETS_ENCRYPTION_KEYS", "")
# The demo's admin (manage.py seed_demo; bin/up names it): blank means the default, as bin/up reads it.
PLATFORM_DEMO_ADMIN_USERNAME = os.environ.get("DEMO_ADMIN_USERNAME", "").strip() or "admin"
PLATFORM_DEMO_ADMIN_PASSWORD = os.environ.get("DEMO_ADMIN_PASSWORD", "")
PLATFORM_CHANGE_GUARD = os.environ.get("PLATFORM_CHANGE_GUARD", "refuse")
# The groups data migrations make (the auditor and reviewer roles) are recorded in the audit at the end of the
# migrate that made them (audit.roles.groups_record_unrecorded). The test suite's databases turn this off so that
# their record starts empty, as after a flush; tests/audit/test_migrated_groups.py checks it on fresh databases.
PLATFORM_AUDIT_MIGRATED_GROUPS = _env_bool("PLATFORM_AUDIT_MIGRATED_GROUPS", default=True)
# The scripted model provider replays canned model turns (tests, benchmarks, demos): never offered in production.
PLATFORM_ALLOW_SCRIPTED_MODEL = _env_bool("PLATFORM_ALLOW_SCRIPTED_MODEL") or DEBUG

# --- security -----------------------------------------------------------------------------------
# Secure cookies unless DEBUG or SECURE_COOKIES=0 (HTTPS itself: PLATFORM_TLS, agent_platform/settings_deploy.py).
SESSION_COOKIE_SECURE = not DEBUG and _env_bool("SECURE_COOKIES", default=not DEBUG)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
# A sign-in to the admin lasts this long (seconds; a working day), not Django's two weeks: a browser left signed in
# is not a way into the configuration and the record for a fortnight.
SESSION_COOKIE_AGE = _env_int("PLATFORM_SESSION_AGE_S", 8 * 3600, at_least=1)
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
# A request body outside the API (the admin's forms) larger than this is a 413 before anything reads it.
PLATFORM_MAX_BODY_BYTES = _env_int("PLATFORM_MAX_BODY_BYTES", 10 * 1024 * 1024, at_least=1)
# Passwords (the admin's login, HTTP Basic on the audit API): after this many failures for one username within
# the window, or PLATFORM_LOGIN_IP_MAX_FAILURES from one client address, every login of that username (or from
# that address) is refused, even with the right password, for PLATFORM_LOGIN_LOCKOUT_S; each lockout is
# audited (security.lockout) and `manage.py unlock_login USER_OR_IP` lifts one (audit/logins.py).
PLATFORM_LOGIN_MAX_FAILURES = _env_int("PLATFORM_LOGIN_MAX_FAILURES", 5, at_least=1)
PLATFORM_LOGIN_IP_MAX_FAILURES = _env_int("PLATFORM_LOGIN_IP_MAX_FAILURES", 20, at_least=1)
PLATFORM_LOGIN_WINDOW_S = _env_int("PLATFORM_LOGIN_WINDOW_S", 900, at_least=1)
# A lockout of 0 s is audited and refuses nothing after (below 0, its Retry-After would be negative).
PLATFORM_LOGIN_LOCKOUT_S = _env_int("PLATFORM_LOGIN_LOCKOUT_S", 900, at_least=0)
# The client's address is REMOTE_ADDR, unless this many trusted proxies in front each append to
# X-Forwarded-For: then it is the address the outermost trusted proxy saw (the Nth entry from the right). Left at 0
# behind a proxy, every client shares the proxy's address, its lockouts and its bad-key throttle: check --deploy
# warns where PLATFORM_TLS=proxy says there is one (audit.W004). Below 0: as 0.
PLATFORM_PROXY_HOPS = _env_int("PLATFORM_PROXY_HOPS", 0)
# The peers whose X-Forwarded-For / X-Forwarded-Proto are believed (agent_platform/client_ip.py): networks,
# comma-separated, and "unix" for a unix socket's peer; unset or empty (docker-compose.yml passes it through empty),
# loopback, the private ranges and unix.
PLATFORM_TRUSTED_PROXIES = _env_list("PLATFORM_TRUSTED_PROXIES") or [
    "127.0.0.0/8",
    "::1/128",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "fc00::/7",
    "unix",
]
_check_networks("PLATFORM_TRUSTED_PROXIES", [n for n in PLATFORM_TRUSTED_PROXIES if n != "unix"])
AUTHENTICATION_BACKENDS = ["audit.logins.LockoutModelBackend"]

# --- logging: every handler masks secrets (audit.masking) -----------------------------------------
# Written in any case and with spaces around it (``info``: gunicorn.conf.py reads it so too); empty or unset: INFO.
# A name logging does not know is refused here, saying so, rather than by logging's own "Unable to configure root
# logger" as every process starts.
LOG_LEVEL = (os.environ.get("LOG_LEVEL") or "").strip().upper() or "INFO"
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
if LOG_LEVEL not in logging.getLevelNamesMapping():
    raise ImproperlyConfigured(f"LOG_LEVEL must be one of {', '.join(_LOG_LEVELS)}, not {LOG_LEVEL!r}")
# "json": one JSON object per line, with the run id and the trace id where known (agent_platform/telemetry.py);
# "plain" (empty or unset too). In any case and with spaces around it, as LOG_LEVEL; any other value (a misspelt
# "jsonl") is refused here, as LOG_LEVEL's, rather than meaning plain without a word.
LOG_FORMAT = (os.environ.get("LOG_FORMAT") or "").strip().lower() or "plain"
_LOG_FORMATS = ("json", "plain")
if LOG_FORMAT not in _LOG_FORMATS:
    raise ImproperlyConfigured(f"LOG_FORMAT must be one of {', '.join(_LOG_FORMATS)}, not {LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"mask_secrets": {"()": "audit.masking.SecretMaskingFilter"}},
    "formatters": {
        "plain": {
            "()": "agent_platform.telemetry.PlainLogFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
        "json": {"()": "agent_platform.telemetry.JsonLogFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "plain",
            "filters": ["mask_secrets"],
        },
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        "mcp": {"level": "WARNING"},
        # The SDK's transports log an ERROR with a traceback for every line or event a server sends that is not
        # MCP (5,000 lines: 5,000 records, each quoting the server's text) and for an answer of the wrong content
        # type. Silenced (CRITICAL) rather than rate-limited: each of these errors also reaches the session, where
        # the pool keeps it masked and cut (the first lines as the server's protocol noise, an unreadable answer
        # as its request's failure, a wrong content type or a broken stream as the session's failure) and says it
        # in the call's error and the server's health; a record of it adds only volume. Their few warnings (a
        # DELETE that failed at a session's end, a GET stream not opened) go with them: none changes a result.
        "mcp.client.stdio": {"level": "CRITICAL"},
        "mcp.client.streamable_http": {"level": "CRITICAL"},
        "mcp.client.sse": {"level": "CRITICAL"},
        "kombu.connection": {"level": "ERROR"},
    },
}
# Python's warnings (a library's deprecation, Django's ASGI handler serving a static file through a synchronous
# iterator) become records of the ``py.warnings`` logger and leave through the console handler above, masked and,
# with LOG_FORMAT=json, as one JSON line: Django leaves them on stderr as plain text (Celery's worker does this too).
logging.captureWarnings(True)

# --- operations: traces, metrics, probes (agent_platform/telemetry.py, agent_platform/probes.py) ---------------
# Traces are on when the standard OTEL_* variables ask for them. A tool's arguments and result become span
# attributes (masked) only when this is on.
PLATFORM_TRACE_TOOL_PAYLOADS = _env_bool("PLATFORM_TRACE_TOOL_PAYLOADS")
# /metrics answers a request with `Authorization: Bearer <this token>`, or from these networks (comma-separated
# addresses or CIDR networks; by default loopback only). Either one lets a scraper in.
PLATFORM_METRICS_TOKEN = os.environ.get("PLATFORM_METRICS_TOKEN", "")
PLATFORM_METRICS_ALLOWED_NETWORKS = _env_list("PLATFORM_METRICS_ALLOWED_NETWORKS", "127.0.0.0/8,::1/128")
# A malformed entry (10.0.0.0/33, 192.168.1.0-24) stops the settings: skipped, its scrapers got a 403.
_check_networks("PLATFORM_METRICS_ALLOWED_NETWORKS", PLATFORM_METRICS_ALLOWED_NETWORKS)
# Every worker writes a heartbeat this often (seconds; 0 or less: never); /readyz wants one no older than the second.
PLATFORM_WORKER_HEARTBEAT_S = _env_float("PLATFORM_WORKER_HEARTBEAT_S", 10.0)
# Eval runs are scored in the background by every worker (a timer thread, every PLATFORM_EVAL_REFRESH_S; 0 or less:
# off), and a case whose run has not finished PLATFORM_EVAL_CASE_TIMEOUT_S after it was submitted (0 or less: never)
# is cancelled and scored as failed (timed out), so that an eval run always ends.
PLATFORM_EVAL_REFRESH_S = _env_float("PLATFORM_EVAL_REFRESH_S", 2.0)
PLATFORM_EVAL_CASE_TIMEOUT_S = _env_float("PLATFORM_EVAL_CASE_TIMEOUT_S", 900.0)
# How many cases of an eval run are in flight at once when it is started from the admin or the API (run_eval's
# --workers defaults to it), so that an eval does not crowd out live traffic on the shared queue. 1 or less: one at
# a time (evals.services.eval_window).
PLATFORM_EVAL_WINDOW = _env_int("PLATFORM_EVAL_WINDOW", 4)
PLATFORM_READY_WORKER_MAX_AGE_S = _env_float("PLATFORM_READY_WORKER_MAX_AGE_S", 60.0, above=0)

# Binding a stdio server runs a program on every worker: optionally allow only these commands (names or paths).
PLATFORM_STDIO_COMMAND_ALLOWLIST = _env_list("PLATFORM_STDIO_COMMAND_ALLOWLIST")
# Server URLs on loopback, link-local, private or metadata addresses are refused unless listed here (hosts,
# host:port or networks, comma-separated); {"from_env": VAR} may read only the variables listed in the second.
PLATFORM_MCP_ALLOW_PRIVATE_URLS = _env_list("PLATFORM_MCP_ALLOW_PRIVATE_URLS")
PLATFORM_MCP_ENV_PASSTHROUGH = _env_list("PLATFORM_MCP_ENV_PASSTHROUGH")
# An openai_compatible agent's base URL obeys the same address policy (a local vLLM/Ollama: list its host here);
# empty: the MCP servers' list.
PLATFORM_MODEL_ALLOW_PRIVATE_URLS = _env_list("PLATFORM_MODEL_ALLOW_PRIVATE_URLS") or PLATFORM_MCP_ALLOW_PRIVATE_URLS
# A pending approval of a write call expires after this long; the run then goes on without the call.
PLATFORM_APPROVAL_TTL_S = _env_int("PLATFORM_APPROVAL_TTL_S", 3600, at_least=1)

# How long the Redis cache may take to connect and to answer (seconds): the rate limits, the login lockouts and the
# gate's memo fail open when it does not, so a Redis that accepts connections and never answers delays a request by
# this much instead of holding it (and its web thread or worker) for ever.
REDIS_CACHE_TIMEOUT_S = _env_float("REDIS_CACHE_TIMEOUT_S", 1.0, above=0)
CACHES = {
    "default": (
        {
            "BACKEND": "agent_platform.redis_cache.RedisCache",
            "LOCATION": REDIS_URL,
            "OPTIONS": {"socket_connect_timeout": REDIS_CACHE_TIMEOUT_S, "socket_timeout": REDIS_CACHE_TIMEOUT_S},
        }
        if REDIS_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}

# The REST API's own settings (OpenAPI, throttling, streaming): see agent_platform/settings_api.py.
from agent_platform.settings_api import *  # noqa: E402, F403

INSTALLED_APPS, REST_FRAMEWORK = [*INSTALLED_APPS, *API_APPS], {**REST_FRAMEWORK, **API_REST_FRAMEWORK}  # noqa: F405
# The body limits above are the ones that hold: Django's own (2.5 MB for a body read whole) would answer a body
# between its limit and ours with its HTML "400 Bad Request".
DATA_UPLOAD_MAX_MEMORY_SIZE = max(PLATFORM_MAX_BODY_BYTES, PLATFORM_API_MAX_BODY_BYTES)  # noqa: F405

# Deployment: HTTPS (PLATFORM_TLS) and the run lifecycle (leases, deliveries, time limits, the reconciler):
# see agent_platform/settings_deploy.py.
from agent_platform.settings_deploy import *  # noqa: E402, F403

if not CELERY_BROKER_URL.startswith("filesystem://"):
    # Longer than any run's hard time limit (checked: agents.E001).
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": CELERY_VISIBILITY_TIMEOUT_S,  # noqa: F405
        **BROKER_REDIS_SOCKET_OPTIONS,
    }

# Error reports and debug pages hide credentials (DATABASE_URL, REDIS_URL, keys) and mask secret values: the filter
# those of the request's data, settings and frame variables; the reporter the rest (query string, exception message).
DEFAULT_EXCEPTION_REPORTER_FILTER = "audit.reporting.MaskingExceptionReporterFilter"
DEFAULT_EXCEPTION_REPORTER = "audit.reporting.MaskingExceptionReporter"
