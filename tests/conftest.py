"""The suite's shared support, as plugins by concern (tests/support/):

- ``actors``: named actors (``worker_a``, ``operator``, …) whose calls read like the contract, and the clock;
- ``races``: competing parties on their own connections, pause points, held row locks, lock-waiter polls;
- ``processes``: real Celery worker processes and the effect target;
- ``parallel``: which tests share a process when the suite runs in several (pytest-xdist, ``make test``);
- ``rollout``: a namespace's stage as the rollout records it, and its stage history replayed (imported by the
  rollout's tests; not a plugin, so the core's tests run without the rollout app).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from claims import clock, interleave
from claims.auth import tokens

pytest_plugins = [
    "tests.support.actors",
    "tests.support.races",
    "tests.support.processes",
    "tests.support.parallel",
]


@pytest.fixture(autouse=True)
def _reset_clock_and_hooks() -> Iterator[None]:
    clock.reset()
    interleave.clear()
    tokens.clear()  # a database rolled back under a remembered token must not authenticate it
    yield
    clock.reset()
    interleave.clear()
    tokens.clear()


# The optional services' databases (settings: DATABASES, from these variables) and what to set for each.
OPTIONAL_DATABASES = {
    "legacy_logical": "LEGACY_OBSERVE_PG_URL",
    "legacy_mysql": "LEGACY_MYSQL_URL",
    "legacy_binlog": "LEGACY_BINLOG_URL",
    "legacy": "DATABASE_URL=postgres://… (a second PostgreSQL database)",
}


def pytest_collection_modifyitems(config, items):
    """A test that names a database its set-up does not have is a visible skip naming the variable to set — never
    an error in set-up (a partial set-up must not stop `make test`; tests/test_partial_setup.py)."""
    from django.conf import settings

    for item in items:
        mark = item.get_closest_marker("django_db")
        wanted = mark.kwargs.get("databases", []) if mark else []
        missing = [] if wanted == "__all__" else [a for a in wanted if a not in settings.DATABASES]
        if missing:
            needs = ", ".join(OPTIONAL_DATABASES.get(alias, alias) for alias in missing)
            item.add_marker(pytest.mark.skip(reason=f"needs {needs} (.ci/run sets it; README, 'Tests')"))
