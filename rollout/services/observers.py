"""Observe mode's observer for the configured legacy table: the change stream on PostgreSQL (``observe``); on
MySQL/MariaDB the binary log (``binlog``) or, where the server keeps none, the polling observer (``poll``;
LEGACY_OBSERVE_MYSQL, ``stream_check.mysql_method``). What the command and the job call."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import connections

from claims import clock
from claims.locks import singleton

from ..legacy import legacy_store
from ..models import ObserverPosition
from ..stream_check import mysql_method
from . import binlog, observe, poll


def method() -> str:
    """``pgoutput``, ``binlog`` or ``poll``: how the configured table is followed."""
    legacy = connections[legacy_store().mapping.database]  # type: ignore[attr-defined]
    return "pgoutput" if legacy.vendor == "postgresql" else mysql_method(legacy)


def setup() -> ObserverPosition:
    return {"pgoutput": observe.setup, "binlog": binlog.setup, "poll": poll.setup}[method()]()


def once(*, limit: int = 1000) -> dict[str, Any]:
    """One pass, alone: what it read and judged. A pass reads the position, judges, and moves it — two at once
    would judge the same changes twice, so a pass holds a named lock (the command and the job alike); a second
    one skips."""
    with singleton("observe_legacy") as got:
        if not got:
            return {"skipped": 1}
        return _pass(limit)


def position_name(how: str | None = None) -> str:
    """The ObserverPosition of the configured table's observer."""
    how = how or method()
    return {
        "pgoutput": settings.LEGACY_OBSERVE_SLOT,
        "binlog": binlog.position_name(),
        "poll": poll.position_name(),
    }[how]


def _behind(how: str, *, oldest: Any) -> None:
    """How far behind legacy the observer was: at the end of this pass, how long the oldest change it judged had
    waited since legacy committed it (0 when the pass found nothing). After a pause, a kill or under a load it cannot
    keep up with, it grows; the console and /metrics show it beside legacy's lease."""
    name = {
        "pgoutput": settings.LEGACY_OBSERVE_SLOT,
        "binlog": binlog.position_name(),
        "poll": poll.position_name(),
    }[how]
    behind = max(0.0, (clock.now() - oldest).total_seconds()) if oldest is not None else 0.0
    ObserverPosition.objects.filter(name=name).update(behind_seconds=behind)


def _pass(limit: int) -> dict[str, Any]:
    counts: dict[str, int]
    how = method()
    if how == "poll":
        counts = poll.poll_once(limit=limit)
        read = counts.pop("rows")
    else:
        counts = (binlog if how == "binlog" else observe).observe_once(limit=limit)
        read = counts.pop("transactions")
    _behind(how, oldest=counts.pop("oldest", None))
    counts.pop("more", None)
    return {"read": read, **counts}
