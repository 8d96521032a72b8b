"""Competing parties at controlled boundaries (a pytest plugin, loaded by tests/conftest.py): a party run on its own
connection, a pause point a service reaches (``claims.interleave``), a row lock held by the test, and polls of
PostgreSQL's own view of who waits on a lock. Tests marked ``postgres`` are skipped, visibly, on SQLite."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, connections, transaction

from claims import interleave


def pytest_collection_modifyitems(config, items):
    from django.conf import settings

    if settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL over several connections (set DATABASE_URL)")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _no_stray_sessions_at_teardown(django_db_setup, django_db_blocker):
    """Live-server and worker threads can leave a PostgreSQL session behind; end them before the test database
    is dropped, so teardown never fails with "being accessed by other users"."""
    yield
    with django_db_blocker.unblock():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )


def run_in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` in a thread with its own database connection; the outcome lands in the returned dict."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


@contextmanager
def row_locked(sql: str, params: list):
    """Hold ``sql``'s row lock (… FOR UPDATE) on another connection until the block ends."""
    locked, release = threading.Event(), threading.Event()

    def hold():
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, params)
            locked.set()
            release.wait(60)

    thread, box = run_in_thread(hold)
    assert locked.wait(10), box
    try:
        yield
    finally:
        release.set()
        thread.join(10)


class Pause:
    """Blocks the thread that reaches ``point`` until the test calls ``resume()``."""

    def __init__(self, point: str, *, times: int = 1):
        self.point = point
        self.reached = threading.Event()
        self._resume = threading.Event()
        self._lock = threading.Lock()
        self._left = times
        interleave.install(point, self._hook)

    def _hook(self) -> None:
        with self._lock:
            if self._left <= 0:
                return
            self._left -= 1
        self.reached.set()
        assert self._resume.wait(30), f"nobody resumed {self.point}"

    def wait_reached(self) -> None:
        assert self.reached.wait(30), f"no thread reached {self.point}"

    def resume(self) -> None:
        self._resume.set()


def _lock_waiters(cursor) -> int:
    cursor.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    return cursor.fetchone()[0]


def wait_for_lock_waiters(count: int, timeout: float = 20.0) -> None:
    """Poll pg_stat_activity until ``count`` backends wait on a row lock (the competing transaction has
    really queued behind the paused one). Polling a condition, not sleeping to make a race."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            if _lock_waiters(cursor) >= count:
                return
            time.sleep(0.01)
    raise AssertionError(f"fewer than {count} transactions waited on a lock within {timeout}s")


def wait_done_or_waiting(box: dict, waiters: int, timeout: float = 20.0) -> None:
    """Poll until the competitor started with ``run_in_thread`` has either finished (its box is filled) or queued
    behind a lock (``waiters`` backends wait): each is a valid order to resume the paused party from."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            if box or _lock_waiters(cursor) >= waiters:
                return
            time.sleep(0.01)
    raise AssertionError(f"the competitor neither finished nor waited on a lock within {timeout}s")


def pg_deadlocks() -> int:
    """PostgreSQL's own count of the deadlocks it detected in the test database (pg_stat_database)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def index_names(tables) -> dict[str, set[str]]:
    """PostgreSQL: the indexes on each of ``tables``, by name."""
    found: dict[str, set[str]] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tablename, indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename = ANY(%s)",
            [list(tables)],
        )
        for table, name in cursor.fetchall():
            found.setdefault(table, set()).add(name)
    return found
