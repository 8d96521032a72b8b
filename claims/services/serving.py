"""The database history the control plane serves from, and the fence a lossy failover needs (issue 39).

Every decision is made in PostgreSQL. When a standby is promoted, what the old primary acknowledged but had not yet
replicated is gone from the new history — with asynchronous replication, a grant of generation *g* to worker A,
answered 200, can vanish, and the new primary grants generation *g* of the same task to worker B. The two tokens
are the same (task, generation, epoch), and a downstream system that fences on them cannot tell the workers apart.

So the control plane records what it serves from (``ServedHistory``: cluster, timeline, synchronous state) and
checks it in every decision: the statement that takes a decision's locks calls ``claims_serving_check()``
(migration 0024), which raises SQLSTATE P0F01 when the live state is not the recorded one. The request is
answered 503 with Retry-After — nothing was decided — after ``serving_check`` has recorded the new state:

- a new timeline (or cluster) after a history that was not synchronous when last seen (or
  ``DATABASE_FAILOVER_FENCE=always``): every namespace's epoch is bumped, audited as ``failover_fence`` by
  ``system:failover`` with its cause, in the transaction that records the new timeline. No token from before the
  switch passes an acceptance point again (FENCED, EPOCH), and a reused generation comes with a newer epoch.
  Claims are not paused: workers claim again at once.
- a new timeline after a synchronous history: recorded, no fence. Patroni's synchronous mode promotes only a
  standby that has every acknowledged commit.
- the synchronous state switched on or off on the same timeline: recorded, so that a failover later is judged on
  the state the history was in.

The check runs inside the decision's own statement, so it also holds behind PgBouncer, whose client connections
outlive the failover. Who runs ``serving_check``: the server, for the request that met P0F01
(``controlplane.middleware.DatabaseFailover``), and the periodic job ``claims.check_serving`` for processes that
answer no request (Celery's jobs retry until it has run).

Lock order: the advisory lock ``claims:serving`` first (one check at a time), then each namespace FOR NO KEY UPDATE
in id order (``epoch_fence``). A decision never waits for the advisory lock: it fails at its first statement and
lets its locks go before anyone runs the check. Limit: the row that records a switch to asynchronous replication is
itself written asynchronously; if a failover loses it, "auto" judges the lost history synchronous. Patroni never
promotes automatically in that state; with anything else, or after a manual failover to a lagging standby, use
``always``.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction

from .. import clock, interleave
from ..models import Namespace, Principal, ServedHistory
from .namespaces import epoch_fence

SYSTEM = Principal(name="system:failover", role="system")

_LIVE = """
SELECT system_identifier::text,
       ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer,
       current_setting('synchronous_standby_names') <> ''
         AND current_setting('synchronous_commit') IN ('on', 'remote_apply', 'remote_write')
FROM pg_control_system()
"""


@dataclass(frozen=True)
class Live:
    system_identifier: str
    timeline: int
    synchronous: bool

    def same(self, row: ServedHistory | None) -> bool:
        return row is not None and (row.system_identifier, row.timeline, row.synchronous) == (
            self.system_identifier,
            self.timeline,
            self.synchronous,
        )

    def new_history(self, row: ServedHistory) -> bool:
        return (row.system_identifier, row.timeline) != (self.system_identifier, self.timeline)


def serving_live() -> Live | None:
    """The database's cluster, timeline and synchronous state now (None on SQLite, which has no failover)."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(_LIVE)
        system_identifier, timeline, synchronous = cursor.fetchone()
    return Live(system_identifier, timeline, synchronous)


def serving_check() -> ServedHistory | None:
    """Record the history the database serves now if it is not the recorded one, fencing every namespace when the
    switch may have lost acknowledged decisions (see the module). Returns the row appended, or None when nothing
    changed. Idempotent, and safe to run from any number of processes at once."""
    if connection.vendor != "postgresql":
        return None
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext('claims:serving'))")
        live = serving_live()
        assert live is not None
        last = ServedHistory.objects.order_by("-id").first()
        interleave.reach("serving_check.read")
        if live.same(last):
            return None
        cause = _cause(live, last)
        fence = (
            last is not None
            and live.new_history(last)
            and (settings.DATABASE_FAILOVER_FENCE == "always" or not last.synchronous)
        )
        # First, so that the fence's own statements pass the check.
        row = ServedHistory.objects.create(
            system_identifier=live.system_identifier,
            timeline=live.timeline,
            synchronous=live.synchronous,
            seen_at=clock.now(),
            fenced=fence,
            cause=cause,
        )
        if fence:
            for name in Namespace.objects.order_by("id").values_list("name", flat=True):
                epoch_fence(
                    principal=SYSTEM, namespace=name, reason=cause, pause=False, action="failover_fence"
                )
        return row


def _cause(live: Live, last: ServedHistory | None) -> str:
    if last is None:
        return "first seen"
    now = f"timeline {live.timeline} (synchronous: {live.synchronous})"
    if last.system_identifier != live.system_identifier:
        return f"another database cluster ({live.system_identifier}, {now}) after {last.system_identifier}"
    if last.timeline != live.timeline:
        lossy = (
            "not synchronous: acknowledged decisions may be lost" if not last.synchronous else "synchronous"
        )
        return f"failover: timeline {last.timeline} → {now}; the history before was {lossy}"
    return f"synchronous replication {'on' if live.synchronous else 'off'} on timeline {live.timeline}"
