from __future__ import annotations

import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from .env import env_bool, env_int, env_json_list, env_list, env_str

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # controlplane/, in a checkout or in site-packages
BASE_DIR = PACKAGE_DIR.parent
# The embedded default's files (SQLite, its broker, the generated secret key, beat's schedule): var/ in a checkout
# (beside manage.py), else var/ in the directory the command runs in — never inside site-packages.
_DEFAULT_VAR = BASE_DIR / "var" if (BASE_DIR / "manage.py").exists() else Path.cwd() / "var"
VAR_DIR = Path(env_str("CONTROLPLANE_VAR_DIR", str(_DEFAULT_VAR)))
VAR_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env_bool("DEBUG", False)


def _secret_key() -> str:
    """SECRET_KEY from the environment; the embedded default keeps one of its own in var/."""
    from_env = env_str("SECRET_KEY", "")
    if from_env:
        # Django's own deploy check (security.W009) asks for 50 characters, 5 of them different.
        if len(from_env) < 50 or len(set(from_env)) < 5 or from_env.startswith("django-insecure-"):
            raise ImproperlyConfigured(
                "SECRET_KEY must be at least 50 characters with at least 5 different ones (for example "
                "python -c 'import secrets; print(secrets.token_urlsafe(50))')"
            )
        return from_env
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(48))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# --- HTTPS behind a proxy (docs/deployment.md) ------------------------------------------------------
# Off by default: the embedded default serves plain HTTP on localhost. `manage.py check --deploy` names each.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
# The health probes answer over plain HTTP too: a load balancer checks the backends directly.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", False)


def _proxy_ssl_header() -> tuple[str, str] | None:
    """SECURE_PROXY_SSL_HEADER as "Header-Name: value" (e.g. "X-Forwarded-Proto: https"): a request the proxy
    marks so is taken as HTTPS. Only behind a proxy that sets the header itself and strips it from clients."""
    raw = env_str("SECURE_PROXY_SSL_HEADER", "")
    if not raw:
        return None
    name, sep, value = raw.partition(":")
    if not sep or not name.strip() or not value.strip():
        raise ImproperlyConfigured(
            f"SECURE_PROXY_SSL_HEADER must look like 'X-Forwarded-Proto: https', got {raw!r}"
        )
    return "HTTP_" + name.strip().upper().replace("-", "_"), value.strip()


SECURE_PROXY_SSL_HEADER = _proxy_ssl_header()
USE_X_FORWARDED_HOST = env_bool("USE_X_FORWARDED_HOST", False)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_prometheus",
    "claims",
    "oncall",
    "rollout",
    "gateway",
]


class _Middleware(list):
    """MIDDLEWARE, where ``"django.…Middleware" in MIDDLEWARE`` also holds for a subclass of it. Django's deploy
    checks (HSTS, the HTTPS redirect, X-Frame-Options, CSRF) look their middleware up by its dotted path, and
    without a match they are skipped, not failed: ours are Django's own classes, subclassed (controlplane/
    middleware.py), so those checks must see them to check anything."""

    def __contains__(self, path: object) -> bool:
        if list.__contains__(self, path):
            return True
        if not isinstance(path, str):
            return False
        from django.utils.module_loading import import_string

        try:
            wanted = import_string(path)
        except ImportError:
            return False
        return any(isinstance(c, type) and issubclass(c, wanted) for c in map(import_string, self))


MIDDLEWARE = _Middleware(
    [
        # Every request's time by route, for /metrics (thread-free under ASGI).
        "controlplane.middleware.RequestLatency",
        # A database failing over is a 503 at every door; a changed history is recorded (and fenced) first.
        "controlplane.middleware.DatabaseFailover",
        # Django's and WhiteNoise's, thread-free under ASGI (controlplane/middleware.py).
        "controlplane.middleware.SecurityMiddleware",
        "controlplane.middleware.StaticFiles",
        # Django's session, CSRF, auth and message middleware, skipped for /api/ (bearer tokens only).
        "controlplane.middleware.SessionMiddleware",
        "controlplane.middleware.CommonMiddleware",
        "controlplane.middleware.CsrfViewMiddleware",
        "controlplane.middleware.AuthenticationMiddleware",
        "controlplane.middleware.MessageMiddleware",
        "controlplane.middleware.XFrameOptionsMiddleware",
    ]
)

ROOT_URLCONF = "controlplane.urls"
WSGI_APPLICATION = "controlplane.wsgi.application"
APPEND_SLASH = False  # the contract's paths have no trailing slash
LOGIN_URL = "/login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [PACKAGE_DIR / "templates"],  # the console's templates, shipped in the controlplane package
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "claims.ui.roles",
                "claims.ui.refusal",
            ],
        },
    },
]

# --- database -------------------------------------------------------------------------------------
# Embedded default: SQLite in var/, every transaction BEGIN IMMEDIATE so writers serialise exactly as
# row locks serialise them on PostgreSQL. DATABASE_URL switches to PostgreSQL (psycopg 3).
DATABASE_URL = env_str("DATABASE_URL", "")
if DATABASE_URL:
    _db = dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 60, minimum=0))
    if _db["ENGINE"] not in ("django.db.backends.postgresql", "django.db.backends.sqlite3"):
        raise ImproperlyConfigured("DATABASE_URL must be a postgres:// or sqlite:// URL")
    _db.setdefault("OPTIONS", {})
    if _db["ENGINE"] == "django.db.backends.sqlite3":
        _db["OPTIONS"].update({"transaction_mode": "IMMEDIATE", "timeout": 30})
    _db["CONN_HEALTH_CHECKS"] = True
    _behind_pgbouncer = env_bool("DATABASE_PGBOUNCER", False)
    if _db["ENGINE"] == "django.db.backends.postgresql" and env_bool(
        "DATABASE_PREPARED_STATEMENTS", not _behind_pgbouncer
    ):
        # Server-side parameters and prepared statements (psycopg 3): a statement run twice on a connection is
        # prepared, then sent as its name and parameters — no parsing or planning per request (about a tenth of
        # PostgreSQL's CPU on the worker path, docs/benchmarks.md). Off by default behind PgBouncer, whose
        # transaction mode (before 1.21's max_prepared_statements) cannot carry them. A statement prepared before a
        # migration changed its table's columns fails once per connection (``claims.errors``: a 503 to retry);
        # psycopg forgets its prepared statements on that rollback.
        _db["OPTIONS"].update({"server_side_binding": True, "prepare_threshold": 2})
    if (
        _db["ENGINE"] == "django.db.backends.postgresql"
        and env_bool("DATABASE_SERVER_SIDE_BINDING", True)
        and "server_side_binding" not in _db["OPTIONS"]
    ):
        # Parameters sent apart from the statement text (the extended protocol, unnamed statements: nothing is
        # prepared, so transaction-mode PgBouncer is fine): psycopg does no quoting in Python — 15 % less CPU per
        # claim-next + commit cycle (docs/benchmarks.md). DATABASE_SERVER_SIDE_BINDING=false for client-side binding.
        _db["OPTIONS"].update({"server_side_binding": True, "prepare_threshold": None})
    if _db["ENGINE"] == "django.db.backends.postgresql" and env_bool("DATABASE_POOL", False):
        # psycopg's connection pool per process (Django 5.1+): what the ASGI server needs, whose requests do not
        # keep a thread (and so a thread-local connection) of their own. Persistent connections are then off.
        _db["OPTIONS"]["pool"] = {
            "min_size": env_int("DATABASE_POOL_MIN", 2, minimum=1),
            "max_size": env_int("DATABASE_POOL_MAX", 20, minimum=1),
            "timeout": 10,
        }
        _db["CONN_MAX_AGE"] = 0
    if _behind_pgbouncer:
        # Behind PgBouncer in transaction mode a named server-side cursor (QuerySet.iterator) would outlive the
        # transaction's server connection. Prepared statements are already off by default.
        _db["DISABLE_SERVER_SIDE_CURSORS"] = True
    _db.setdefault("TEST", {})
    if env_str("TEST_DATABASE_NAME", ""):
        _db["TEST"]["NAME"] = env_str("TEST_DATABASE_NAME")
else:
    _db = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(VAR_DIR / "controlplane.sqlite3"),
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }
DATABASES = {"default": _db}
# What a failover does (PostgreSQL; docs/deployment.md "High availability"). The control plane records the cluster,
# timeline and synchronous state it serves from (claims.ServedHistory); on a new timeline it bumps every namespace's
# epoch before any decision on the new history — "auto": unless the history it served was synchronous when last
# seen (Patroni's synchronous mode promotes only a standby that has every acknowledged commit); "always": on every
# new timeline and every new cluster.
DATABASE_FAILOVER_FENCE = env_str("DATABASE_FAILOVER_FENCE", "auto")
if DATABASE_FAILOVER_FENCE not in ("auto", "always"):
    raise ImproperlyConfigured("DATABASE_FAILOVER_FENCE must be auto or always")
# A team's own legacy claim table, in its own database (rollout.legacy_table, docs/adopting.md): PostgreSQL or
# MySQL/MariaDB. The control plane never migrates it (controlplane.routers) and writes only the mapped columns.
LEGACY_DATABASE_URL = env_str("LEGACY_DATABASE_URL", "")
# How long a decision waits for a row of the legacy table that the team's own workers hold locked, before it fails
# cleanly (a 503; V1_WRITES' write-through is left to its job): never an unbounded wait behind their transaction.
LEGACY_LOCK_TIMEOUT_SECONDS = env_int("LEGACY_LOCK_TIMEOUT_SECONDS", 5, minimum=1)
# Observe mode on PostgreSQL (rollout.stream_check, docs/adopting.md): the publication and the logical replication
# slot the observer reads the team's table through (pgoutput).
LEGACY_OBSERVE_PUBLICATION = env_str("LEGACY_OBSERVE_PUBLICATION", "claim_control_plane")
LEGACY_OBSERVE_SLOT = env_str("LEGACY_OBSERVE_SLOT", "claim_control_plane")
# When the slot may forget what the observer judged (issue 39): ``auto`` (the default) — at once where the control
# plane's own database is synchronous or has no standby (a single node); where it has asynchronous standbys, only
# once our record of the judgement is flushed on every one of them (pg_stat_replication), so a failover that loses
# our last judgements finds their changes still in the slot. ``standby`` — always wait for a standby (a cluster whose
# standbys are all disconnected holds the slot: its WAL waits in their database). ``commit`` — at our commit.
LEGACY_OBSERVE_SLOT_RELEASE = env_str("LEGACY_OBSERVE_SLOT_RELEASE", "auto")
if LEGACY_OBSERVE_SLOT_RELEASE not in ("auto", "standby", "commit"):
    raise ImproperlyConfigured(
        f"LEGACY_OBSERVE_SLOT_RELEASE must be auto, standby or commit, not {LEGACY_OBSERVE_SLOT_RELEASE!r}"
    )
# Observe mode on MySQL/MariaDB (docs/adopting.md): ``binlog`` reads the row-based binary log as a replica of its own
# (rollout.services.binlog: every change, in commit order); ``poll`` polls the 'changed' column (rollout.services.poll:
# only the states between passes); ``auto`` (the default) reads the binlog where the server keeps one (log_bin ON),
# else polls — ``legacy_check --observe`` says which, and why.
LEGACY_OBSERVE_MYSQL = env_str("LEGACY_OBSERVE_MYSQL", "auto")
if LEGACY_OBSERVE_MYSQL not in ("auto", "binlog", "poll"):
    raise ImproperlyConfigured(
        f"LEGACY_OBSERVE_MYSQL must be auto, binlog or poll, not {LEGACY_OBSERVE_MYSQL!r}"
    )
# The binlog reader's server_id: unique among the legacy server's replicas (a clash disconnects the other one).
LEGACY_BINLOG_SERVER_ID = env_int("LEGACY_BINLOG_SERVER_ID", 1_004_127, minimum=1, maximum=4_294_967_295)
# Entering SHADOW over a team's table imports its rows as tasks, this many per transaction (rollout.services.adoption).
LEGACY_IMPORT_BATCH = env_int("LEGACY_IMPORT_BATCH", 2000, minimum=1, maximum=50_000)
# Observe mode on: the rollout.observe_legacy job follows the table every 2 s (after manage.py legacy_observe --setup).
ROLLOUT_LEGACY_OBSERVE = env_bool("ROLLOUT_LEGACY_OBSERVE", False)
# The polling observer (MySQL/MariaDB, rollout.services.poll) reads a timestamp 'changed' column only up to this long
# ago, so that a write whose transaction was still open when a pass went by is not skipped.
LEGACY_POLL_MARGIN_SECONDS = float(env_str("LEGACY_POLL_MARGIN_SECONDS", "2"))
# A legacy decision in another database whose commit there nobody has seen for this long is judged from that table
# (rollout.services.legacy_decisions): the request that made it is dead, or about to mark it itself.
LEGACY_DECISION_GRACE_SECONDS = env_int("LEGACY_DECISION_GRACE_SECONDS", 10, minimum=0)


def legacy_options(engine: str, options: dict | None = None) -> dict:
    """A legacy database connection's OPTIONS: on MySQL/MariaDB row locks and READ COMMITTED as on PostgreSQL (a
    decision reads the row it locked, as it is now); on both, LEGACY_LOCK_TIMEOUT_SECONDS as the lock wait bound."""
    options = dict(options or {})
    if engine == "django.db.backends.mysql":
        options.update(
            {
                "isolation_level": "read committed",
                "charset": "utf8mb4",
                "init_command": f"SET SESSION innodb_lock_wait_timeout = {LEGACY_LOCK_TIMEOUT_SECONDS}",
            }
        )
    else:
        options["options"] = f"-c lock_timeout={LEGACY_LOCK_TIMEOUT_SECONDS * 1000}"
    return options


if LEGACY_DATABASE_URL:
    _legacy = dj_database_url.parse(LEGACY_DATABASE_URL, conn_max_age=60)
    if _legacy["ENGINE"] not in ("django.db.backends.postgresql", "django.db.backends.mysql"):
        raise ImproperlyConfigured("LEGACY_DATABASE_URL must be a postgres:// or mysql:// URL")
    _legacy["CONN_HEALTH_CHECKS"] = True
    _legacy["OPTIONS"] = legacy_options(_legacy["ENGINE"], _legacy.get("OPTIONS"))
    _legacy["TEST"] = {"NAME": env_str("LEGACY_TEST_DATABASE_NAME", "") or None}
    DATABASES["legacy"] = _legacy
DATABASE_ROUTERS = ["controlplane.routers.DefaultDatabaseOnly"]
# The legacy table's mapping (rollout.legacy_table.TableMapping): JSON, inline or the path of a file holding it.
ROLLOUT_LEGACY_TABLE = env_str("ROLLOUT_LEGACY_TABLE", "")
# The waiting claims' LISTEN (claims/waiting.py) needs a session of its own for as long as it listens: behind a
# transaction-mode pooler (PgBouncer) point DATABASE_LISTEN_URL at PostgreSQL itself. Empty: DATABASE_URL's.
DATABASE_LISTEN_URL = env_str("DATABASE_LISTEN_URL", "")
DATABASE_LISTEN = dj_database_url.parse(DATABASE_LISTEN_URL) if DATABASE_LISTEN_URL else None
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
DATETIME_FORMAT = "Y-m-d H:i:s T"  # the console shows seconds: leases are short

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True  # serve app static files without collectstatic on the embedded default

# --- REST API -------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["claims.auth.BearerTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["claims.permissions.AnyRole"],
    "DEFAULT_PARSER_CLASSES": ["claims.parsers.StrictJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["claims.renderers.SafeJSONRenderer"],
    "DEFAULT_PAGINATION_CLASS": "claims.pagination.Pagination",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "claims.errors.exception_handler",
    "DEFAULT_THROTTLE_CLASSES": ["claims.throttling.PrincipalRateThrottle"],
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "claim control plane — claim.v1",
    "DESCRIPTION": (
        "Fenced claims for multi-agent work. Outcome words, fields and status codes follow the frozen "
        "claim.v1 contract. Every decision uses the database clock. 409 bodies are "
        "`{outcome, reason, detail, current}`; 400 bodies are `{outcome: INVALID, errors}`. "
        "Claim, renew, release and commit are routed by the namespace's rollout stage: LEGACY → 409 STAGE_NOT_OPEN; "
        "SHADOW and V1_READS → the legacy store decides (refusal words HELD, NOT_OWNER) and the answer adds the "
        'shadow attempt\'s claim.v1 fields (null where claim.v1 refused), `decided_by: "legacy"` and '
        "`shadow: {verdict, reason, mismatch_id}`; V1_WRITES → claim.v1 decides and writes the legacy store too; "
        "V1_ONLY → claim.v1 only. The epoch rule holds in every stage. The legacy protocol is under /api/legacy/."
    ),
    # The schema's own version (a package version, as generators want one); the wire contract it describes is
    # claim.v1 with its §9 and §10 additions (info.x-contract, x-contract-version "1.10"): the clients' versions are
    # 1.10.x — the contract's major and minor, their own patch (tests/sdk/test_published_clients.py).
    "VERSION": "0.12.0",
    "EXTENSIONS_INFO": {"x-contract": "claim.v1", "x-contract-version": "1.10"},
    # The enum hook rebuilds the components: ours adds its own after it.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "claims.schema.document_every_operation",
        "claims.schema.literal_answers",
    ],
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # A task's state is one enum everywhere it appears (without this drf-spectacular names it after a hash).
    "ENUM_NAME_OVERRIDES": {"TaskStateEnum": "claims.models.TaskState"},
}

# --- cache -----------------------------------------------------------------------------------------
# The rate limit's counters live in the cache: per process by default; CACHE_URL=redis://… shares them (and every
# other cached value) between all app-server processes and hosts.
CACHE_URL = env_str("CACHE_URL", "")
if CACHE_URL:
    if not CACHE_URL.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured("CACHE_URL must be a redis://, rediss:// or unix:// URL")
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": CACHE_URL,
            "KEY_PREFIX": env_str("CACHE_KEY_PREFIX", "controlplane"),
            "OPTIONS": {"socket_timeout": 2, "socket_connect_timeout": 2},
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# A token found is remembered per process this long: revocation takes effect everywhere within it (claims/auth.py).
TOKEN_CACHE_SECONDS = env_int("TOKEN_CACHE_SECONDS", 5, minimum=0, maximum=300)

# Requests per principal (DRF rate syntax: N/s, N/min, N/hour); empty disables the limit.
API_RATE_LIMIT = env_str("API_RATE_LIMIT", "6000/min")

# --- claim.v1 -------------------------------------------------------------------------------------
LEASE_MIN_SECONDS = env_int("LEASE_MIN_SECONDS", 1, minimum=1)
LEASE_MAX_SECONDS = env_int("LEASE_MAX_SECONDS", 300, minimum=1)
if LEASE_MAX_SECONDS < LEASE_MIN_SECONDS:
    raise ImproperlyConfigured("LEASE_MAX_SECONDS must be at least LEASE_MIN_SECONDS")
# Upper bound of any JSON value a client may send (task input, staged result), in bytes.
CLAIMS_MAX_VALUE_BYTES = env_int("CLAIMS_MAX_VALUE_BYTES", 1_000_000, minimum=1024)
# /metrics and the namespace pages count a namespace's READY tasks of one priority up to this many (claims.queues),
# and past it add up its keys' schedules: a scrape's cost is bounded whatever the backlog.
CLAIMS_BACKLOG_COUNT_CAP = env_int("CLAIMS_BACKLOG_COUNT_CAP", 1_000, minimum=1)
DATA_UPLOAD_MAX_MEMORY_SIZE = CLAIMS_MAX_VALUE_BYTES * 2 + 65536
# /metrics needs no token unless this is set; then it wants "Authorization: Bearer <METRICS_TOKEN>".
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
# Lists count their rows exactly up to this many; past it `count` is this and X-Count-Capped says so (pagination.py).
API_LIST_COUNT_CAP = env_int("API_LIST_COUNT_CAP", 1000, minimum=100)
# /metrics reads folded tallies plus what was written since the last fold (the `fold_metrics` beat job): records
# stamped this long before the fold's clock (or before the oldest open transaction began) are folded.
METRICS_FOLD_LAG_SECONDS = env_int("METRICS_FOLD_LAG_SECONDS", 30, minimum=1, maximum=3600)
# Every Celery job's finished runs are recorded (claims.JobRun: the Jobs page, /metrics' job ages) and kept this long.
JOB_RUNS_KEEP_HOURS = env_int("JOB_RUNS_KEEP_HOURS", 24, minimum=1, maximum=24 * 90)

# --- rollout (rollout.md) -------------------------------------------------------------------------------
ROLLOUT_WINDOW_SECONDS = env_int("ROLLOUT_WINDOW_SECONDS", 3600, minimum=1)
ROLLOUT_MIN_SAMPLES = env_int("ROLLOUT_MIN_SAMPLES", 1000, minimum=1)
ROLLOUT_MIN_COVERAGE_SAMPLES = env_int("ROLLOUT_MIN_COVERAGE_SAMPLES", 100, minimum=1)
DRAIN_INTERVAL_SECONDS = env_int("DRAIN_INTERVAL_SECONDS", 15, minimum=1)
WORKER_STALE_SECONDS = env_int("WORKER_STALE_SECONDS", 60, minimum=1)
# Retention (docs/operations.md): timeline events, attempts and the rollout's per-operation records older
# than this are deleted by the prune_history jobs, when nothing still needs them; 0 keeps everything. Longer than
# the rollout window, so no gate or coverage figure loses a record it counts.
RETENTION_SECONDS = env_int("RETENTION_SECONDS", 30 * 86400, minimum=0)
AUDIT_RETENTION_SECONDS = env_int("AUDIT_RETENTION_SECONDS", 365 * 86400, minimum=86400)
RETENTION_BATCH = env_int("RETENTION_BATCH", 2000, minimum=1, maximum=50_000)
# A claim sent again with its Idempotency-Key within this long answers what it was granted (docs/workers.md, "Retrying
# a claim"); older keys are deleted by the same job, and a repeat is then a new request.
CLAIM_KEY_RETENTION_SECONDS = env_int("CLAIM_KEY_RETENTION_SECONDS", 86400, minimum=60)
if RETENTION_SECONDS and RETENTION_SECONDS <= ROLLOUT_WINDOW_SECONDS + METRICS_FOLD_LAG_SECONDS:
    raise ImproperlyConfigured(
        "RETENTION_SECONDS must be 0 (keep everything) or more than ROLLOUT_WINDOW_SECONDS + "
        f"METRICS_FOLD_LAG_SECONDS ({RETENTION_SECONDS} ≤ {ROLLOUT_WINDOW_SECONDS} + {METRICS_FOLD_LAG_SECONDS})"
    )
ROLLOUT_LEGACY_STORE = env_str("ROLLOUT_LEGACY_STORE", "rollout.legacy.DjangoLegacyStore")
# A fence request whose job has not finished this long (its worker died, or its message was lost) is sent again
# by `resend_fences`; the fence itself is applied once whatever the number of runs.
FENCE_RESEND_AFTER_SECONDS = env_int("FENCE_RESEND_AFTER_SECONDS", 30, minimum=1)

# --- the MCP tool gateway (docs/mcp.md) -----------------------------------------------------------------
# Downstream MCP servers fixed by the deployment (the console adds more): a JSON list of
# {"name", "prefix"?, "command": [argv…] | "url", "env"?, "call_timeout_seconds"?, "trust_annotations"?}.
MCP_DOWNSTREAMS = env_json_list("MCP_DOWNSTREAMS", [])
for _entry in MCP_DOWNSTREAMS:
    if not isinstance(_entry.get("name"), str) or not (_entry.get("command") or _entry.get("url")):
        raise ImproperlyConfigured(
            f"MCP_DOWNSTREAMS: each server needs a name and a command or url, got {_entry!r}"
        )
# Per-tool rules fixed by the deployment: {"downstream", "tool", "kind"?, "slot_from"?, "slot_argument"?,
# "query_tool"?, "query_arguments"?, "occurred_if"?, "occurred_text"?, "record_reads"?}; the console's win.
MCP_TOOL_RULES = env_json_list("MCP_TOOL_RULES", [])
# A call's sender silent this long past its server's timeout (its process died mid-call) is recorded UNKNOWN.
MCP_LOST_GRACE_SECONDS = env_int("MCP_LOST_GRACE_SECONDS", 30, minimum=1)
# How long a process keeps the console's servers and tool rules before reading them again (a change made in the
# process itself is seen at once).
MCP_CONFIG_CACHE_SECONDS = env_int("MCP_CONFIG_CACHE_SECONDS", 5, minimum=0)
# The largest answer read from a downstream server (one SSE event). The ledger keeps an answer only up to
# CLAIMS_MAX_VALUE_BYTES; a larger one reaches its caller once and is recorded as happened, without its body.
MCP_MAX_ANSWER_BYTES = env_int("MCP_MAX_ANSWER_BYTES", 16 * 1024 * 1024, minimum=65536)
# How often a long call's progress is written to its intent (the sender is alive: no other call records it lost).
MCP_HEARD_EVERY_SECONDS = env_int("MCP_HEARD_EVERY_SECONDS", 5, minimum=1)

# --- the dispatch gateway (claim-v1.md §6) ------------------------------------------------------------
# Hosts a dispatch may target (exact host names or IPs); anything else is a 400. Empty: no dispatch allowed.
DISPATCH_ALLOWED_HOSTS = env_list("DISPATCH_ALLOWED_HOSTS", [])
DISPATCH_TIMEOUT_SECONDS = env_int("DISPATCH_TIMEOUT_SECONDS", 10, minimum=1, maximum=300)
# A delivery taken but silent this long (its runner died) may be taken again, under the same key.
DISPATCH_RESEND_AFTER_SECONDS = env_int("DISPATCH_RESEND_AFTER_SECONDS", 120, minimum=1)
if DISPATCH_RESEND_AFTER_SECONDS <= 3 * DISPATCH_TIMEOUT_SECONDS:
    # The first sender must have given up (connect, write and read each bounded by the timeout) before a second
    # takes the delivery, or the two could both be talking to the target when the first reply is applied.
    raise ImproperlyConfigured(
        "DISPATCH_RESEND_AFTER_SECONDS must be more than 3 × DISPATCH_TIMEOUT_SECONDS "
        f"({DISPATCH_RESEND_AFTER_SECONDS} ≤ 3 × {DISPATCH_TIMEOUT_SECONDS})"
    )
