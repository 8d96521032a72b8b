"""Reads of the database the control plane decides in: its role, timeline and replication now, and the history it
has served (issue 39). /metrics and the console's incident header share ``database_state``; it writes nothing.

Replication figures come from ``pg_stat_replication`` on the primary. PostgreSQL shows another role's WAL
positions only to superusers and members of ``pg_monitor``: grant it to the control plane's role
(docs/deployment.md, "High availability"), or the lag reads as unknown.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection

from .models import ServedHistory

_NOW = """
SELECT pg_is_in_recovery(),
       CASE WHEN pg_is_in_recovery() THEN (SELECT timeline_id FROM pg_control_checkpoint())
            ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer END,
       current_setting('synchronous_standby_names') <> ''
         AND current_setting('synchronous_commit') IN ('on', 'remote_apply', 'remote_write')
"""
_STANDBYS = """
SELECT application_name, sync_state, state,
       CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn) END
FROM pg_stat_replication ORDER BY application_name
"""


@dataclass(frozen=True)
class Standby:
    name: str
    sync_state: str  # sync | quorum | potential | async
    state: str  # streaming | catchup | …
    lag_bytes: float | None  # None: not shown to this role (pg_monitor), or unknown


@dataclass(frozen=True)
class DatabaseState:
    vendor: str
    primary: bool = True
    timeline: int | None = None
    synchronous: bool = False
    standbys: list[Standby] = field(default_factory=list)
    # What the control plane has recorded (``ServedHistory``): the history it decides on, and its switches.
    served_timeline: int | None = None
    failovers: int = 0  # new timelines (or clusters) recorded after the first
    fences: int = 0  # of which were fenced
    last_failover_at: datetime | None = None
    last_failover_fenced: bool = False

    @property
    def sync_standbys(self) -> int:
        return sum(1 for s in self.standbys if s.sync_state in ("sync", "quorum") and s.state == "streaming")

    @property
    def unchecked(self) -> bool:
        """The database serves a timeline the control plane has not recorded yet: decisions wait for the check."""
        return self.timeline is not None and self.primary and self.served_timeline != self.timeline


def database_state() -> DatabaseState:
    if connection.vendor != "postgresql":
        return DatabaseState(vendor=connection.vendor)
    with connection.cursor() as cursor:
        cursor.execute(_NOW)
        in_recovery, timeline, synchronous = cursor.fetchone()
        cursor.execute(_STANDBYS)
        standbys = [Standby(name, sync, state, lag) for name, sync, state, lag in cursor.fetchall()]
    history = list(
        ServedHistory.objects.order_by("id").values_list("system_identifier", "timeline", "seen_at", "fenced")
    )
    switches = [now for before, now in itertools.pairwise(history) if now[:2] != before[:2]]
    return DatabaseState(
        vendor="postgresql",
        primary=not in_recovery,
        timeline=timeline,
        synchronous=synchronous,
        standbys=standbys,
        served_timeline=history[-1][1] if history else None,
        failovers=len(switches),
        fences=sum(1 for row in switches if row[3]),
        last_failover_at=switches[-1][2] if switches else None,
        last_failover_fenced=bool(switches and switches[-1][3]),
    )
