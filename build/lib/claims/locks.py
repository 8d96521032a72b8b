"""Named PostgreSQL advisory locks: how a periodic job that must run alone makes sure it does, without asking the
broker what else runs.

The lock is transaction-scoped (``pg_try_advisory_xact_lock``) and held by a transaction on a connection of its
own, opened for the job and kept open while the job runs; the job's services use the ordinary connection and their
own transactions. Behind PgBouncer in transaction mode this is what stays sound: an open transaction keeps its
one server connection, so the lock lives exactly as long as the holding transaction — a session-level lock would
be taken on whichever server connection one statement happened to get and released (or not) on another. When the
holder ends the transaction, or dies and its client connection drops, PostgreSQL (or PgBouncer, closing the server
side) ends the transaction and the lock with it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DEFAULT_DB_ALIAS, connection, connections


@contextmanager
def singleton(name: str) -> Iterator[bool]:
    """Try the advisory lock ``name``; yields whether we got it. On SQLite (one writer at a time anyway) it is
    always granted."""
    if connection.vendor != "postgresql":
        yield True
        return
    holder = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(hashtext(%s))", [f"claims:{name}"])
            (got,) = cursor.fetchone()
        yield bool(got)
    finally:
        try:
            holder.rollback()  # ends the holding transaction: the lock goes with it
        finally:
            holder.close()
