"""Observe mode's observer for the configured legacy table: the change stream on PostgreSQL (``observe``), the
polling observer on MySQL/MariaDB (``poll``). What the command and the job call."""

from __future__ import annotations

from typing import Any

from django.db import connections

from claims.locks import singleton

from ..legacy import legacy_store
from ..models import ObserverPosition
from . import observe, poll


def _polls() -> bool:
    return connections[legacy_store().mapping.database].vendor == "mysql"  # type: ignore[attr-defined]


def setup() -> ObserverPosition:
    return poll.setup() if _polls() else observe.setup()


def once(*, limit: int = 1000) -> dict[str, Any]:
    """One pass, alone: what it read and judged. A pass reads the position, judges, and moves it — two at once
    would judge the same changes twice, so a pass holds a named lock (the command and the job alike); a second
    one skips."""
    with singleton("observe_legacy") as got:
        if not got:
            return {"skipped": 1}
        return _pass(limit)


def _pass(limit: int) -> dict[str, Any]:
    counts: dict[str, int]
    if _polls():
        counts = poll.poll_once(limit=limit)
        read = counts.pop("rows")
    else:
        counts = observe.observe_once(limit=limit)
        read = counts.pop("transactions")
    return {"read": read, **counts}
