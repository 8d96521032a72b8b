"""The database clock. Every lease decision reads time here, never from a worker and never from Python.

On PostgreSQL it is ``statement_timestamp()``; a service reads it once (with the namespace row) and makes every
comparison of its transaction against that one instant. The embedded SQLite database lives in the server's own process, so its clock is the server's clock.

``as_of`` judges a decision already made elsewhere at the instant it was made: observe mode replays a legacy
table's changes, each at its commit's timestamp, so that a lagging or restarted observer reaches the verdicts of one
that kept up (docs/adopting.md, "Time"). Inside it every reading — ``now`` and ``from_db`` — is that instant.

``travel`` moves the clock forward for the suite's controllable-clock fixture (acceptance.md: no wall-clock
sleeps to make races). It is an offset added to the database's answer, shared by every thread of the process.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

_offset = timedelta(0)
_frozen: datetime | None = None  # tests only: a clock that moves only when travel() moves it
_as_of: ContextVar[datetime | None] = ContextVar("claims_clock_as_of", default=None)


@contextmanager
def as_of(instant: datetime) -> Iterator[None]:
    """Every clock reading inside is ``instant`` (an aware datetime): a decision judged at the time it was made."""
    token = _as_of.set(instant)
    try:
        yield
    finally:
        _as_of.reset(token)


def now() -> datetime:
    instant = _as_of.get()
    if instant is not None:
        return instant
    if _frozen is not None:
        return _frozen + _offset
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement_timestamp()")
            (value,) = cursor.fetchone()
    else:
        value = timezone.now()
    return value + _offset


def from_db(value: datetime | None) -> datetime:
    """A clock reading taken by a statement (``statement_timestamp()``), or None on SQLite; offset applied."""
    instant = _as_of.get()
    if instant is not None:
        return instant
    if _frozen is not None:
        return _frozen + _offset
    return (value if value is not None else timezone.now()) + _offset


def offset() -> timedelta:
    return _offset


def travel(seconds: float) -> None:
    """Move the clock ``seconds`` forward (tests only)."""
    global _offset
    _offset += timedelta(seconds=seconds)


def freeze() -> None:
    """Stop the clock at the current time; only travel() moves it (tests that compare against a model)."""
    global _frozen
    _frozen = timezone.now()


def reset() -> None:
    global _offset, _frozen
    _offset = timedelta(0)
    _frozen = None
