"""Settings for the suite: the same as production but fast password hashing and eager-capable Celery."""

from __future__ import annotations

import os
from importlib.util import find_spec
from urllib.parse import urlsplit

from . import *  # noqa: F401,F403
from .base import DATABASES, INSTALLED_APPS, legacy_options
from .celery import CELERY_BROKER_URL
from .env import env_bool, env_int, env_list, env_str

# A downstream receiver's guard table (claim_client.receiver, clients/python), for its tests.
INSTALLED_APPS = [*INSTALLED_APPS, "tests.receiver.apps.ReceiverConfig"]
# Jobs run inline unless a test drives a real worker; the effect target the tests start listens on 127.0.0.1.
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", True)
DISPATCH_ALLOWED_HOSTS = env_list("DISPATCH_ALLOWED_HOSTS", ["127.0.0.1", "localhost"])
DISPATCH_TIMEOUT_SECONDS = env_int("DISPATCH_TIMEOUT_SECONDS", 2, minimum=1)
# Tests share principal names across cases; the rate-limit test turns the limit on for itself.
API_RATE_LIMIT = ""

# The suite in several processes (pytest-xdist, tests/support/parallel.py): each process its own Redis database for
# jobs (15 → 14, 13, …), so that one's workers never take another's jobs and one's flush never drops another's. Set
# in the environment too, once: the workers and servers a test starts inherit it and must not move it again.
_xdist_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if (
    _xdist_worker
    and CELERY_BROKER_URL.startswith("redis://")
    and not os.environ.get("TEST_BROKER_PER_PROCESS")
):
    _url = urlsplit(CELERY_BROKER_URL)
    _index = (int(_url.path.strip("/") or 0) - 1 - int(_xdist_worker.removeprefix("gw"))) % 16
    CELERY_BROKER_URL = os.environ["CELERY_BROKER_URL"] = _url._replace(path=f"/{_index}").geturl()
    os.environ["TEST_BROKER_PER_PROCESS"] = "1"

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not :memory:, so that several connections (threads) see one database.
    DATABASES["default"]["TEST"] = {"NAME": str(DATABASES["default"].get("NAME")) + ".test"}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and "legacy" not in DATABASES:
    # A team's own legacy database for the legacy table adapter's tests (tests/rollout/test_legacy_table.py), beside
    # ours on the same server: created empty by the test run, never migrated (controlplane.routers).
    _default = DATABASES["default"]
    _test_name = (_default.get("TEST") or {}).get("NAME") or f"test_{_default['NAME']}"
    DATABASES["legacy"] = {
        **_default,
        "OPTIONS": legacy_options(
            _default["ENGINE"], {k: v for k, v in _default.get("OPTIONS", {}).items() if k != "pool"}
        ),
        "NAME": f"{_default['NAME']}_legacy",
        "TEST": {"NAME": f"{_test_name}_legacy"},
    }
if env_str("LEGACY_OBSERVE_PG_URL", "") and "legacy_logical" not in DATABASES:
    # A team's own PostgreSQL with wal_level = logical, a cluster of its own (scripts/legacy-pg-cluster.sh, started by
    # .ci/run): the change stream's pre-flight and the observer (observe mode) are tested against it.
    import dj_database_url

    _logical = dj_database_url.parse(env_str("LEGACY_OBSERVE_PG_URL"))
    _logical["OPTIONS"] = legacy_options(_logical["ENGINE"])
    _logical["TEST"] = {"NAME": f"test_{_logical['NAME']}"}
    DATABASES["legacy_logical"] = _logical
if env_str("LEGACY_MYSQL_URL", "") and "legacy_mysql" not in DATABASES and find_spec("MySQLdb"):
    # The same tests against a MariaDB/MySQL legacy database (.ci/run starts Debian's mariadb-server and sets this).
    import dj_database_url

    _mysql = dj_database_url.parse(env_str("LEGACY_MYSQL_URL"))
    _mysql["OPTIONS"] = legacy_options(_mysql["ENGINE"])
    _mysql["TEST"] = {"NAME": f"test_{_mysql['NAME']}"}
    DATABASES["legacy_mysql"] = _mysql
if env_str("LEGACY_BINLOG_URL", "") and "legacy_binlog" not in DATABASES and find_spec("MySQLdb"):
    # A MariaDB with its binary log on, an instance of its own (scripts/legacy-mariadb-binlog.sh, port 3307, started by
    # .ci/run): observe mode's binlog reader is tested against it.
    import dj_database_url

    _binlog = dj_database_url.parse(env_str("LEGACY_BINLOG_URL"))
    _binlog["OPTIONS"] = legacy_options(_binlog["ENGINE"])
    _binlog["TEST"] = {"NAME": f"test_{_binlog['NAME']}"}
    DATABASES["legacy_binlog"] = _binlog
