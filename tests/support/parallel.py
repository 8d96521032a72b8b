"""The suite in several processes (pytest-xdist, ``make test``: ``-n 2 --dist loadgroup``), a pytest plugin loaded by
tests/conftest.py. Each process has its own test databases (pytest-django suffixes them) and its own Redis database
for jobs (controlplane/settings/test.py); what is shared beyond that decides where a test runs:

- a module's tests run in one process, so that its module- and session-scoped set-ups (a clean venv per Python, a
  packed client) are made once;
- tests that follow a legacy change stream (and the drills and soaks that name every legacy database) run alone
  after the rest, as ``serial`` tests: the logical replication slot and publication are per cluster and the binlog
  reader's server_id per server, and their observer processes keep time with short leases — beside another
  process's load, one CI run saw a drill's observer fall 30 s behind and a proxy drill count mismatches twice;
- the SDK tests share one process: they run ``npm ci`` in clients/typescript, which the others copy;
- tests marked ``serial`` (those, and the two that restart the PostgreSQL every process uses) run alone after the
  rest: ``make test`` runs them with ``-m serial``.
"""

from __future__ import annotations

import os

import pytest

# The databases whose readers hold a per-server place (a replication slot, a binlog server_id).
STREAM_DATABASES = {"legacy_logical", "legacy_binlog"}


def group_of(item: pytest.Item) -> str:
    mark = item.get_closest_marker("django_db")
    databases = mark.kwargs.get("databases", []) if mark else []
    if databases == "__all__" or STREAM_DATABASES & set(databases):
        return "legacy-stream"
    module = item.nodeid.split("::", 1)[0]
    if module.startswith("tests/sdk/"):
        return "sdk"
    return module


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    in_parallel = bool(os.environ.get("PYTEST_XDIST_WORKER"))
    for item in items:
        group = group_of(item)
        item.add_marker(pytest.mark.xdist_group(group))
        if group == "legacy-stream":
            item.add_marker(pytest.mark.serial)
        if in_parallel and "serial" in item.keywords:
            item.add_marker(
                pytest.mark.skip(
                    reason="runs alone, not beside other test processes (make test runs it after them, with -m serial)"
                )
            )
