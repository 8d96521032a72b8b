"""Named PostgreSQL advisory locks: how a periodic job that must run alone makes sure it does, without asking the
broker what else runs. Session-level and released in ``finally`` (a crashed holder's session ends, and with it
the lock), so the job's own services keep their own transactions."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection


@contextmanager
def singleton(name: str) -> Iterator[bool]:
    """Try the advisory lock ``name``; yields whether we got it. On SQLite (one writer at a time anyway) it is
    always granted."""
    if connection.vendor != "postgresql":
        yield True
        return
    key = f"claims:{name}"
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(hashtext(%s))", [key])
        (got,) = cursor.fetchone()
    try:
        yield bool(got)
    finally:
        if got:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(hashtext(%s))", [key])
