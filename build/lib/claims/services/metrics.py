"""Folding the history into the metric tallies (``models.metrics``), so a scrape never reads the whole history."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F

from .. import clock, tallies
from ..models import MetricFold, MetricTally, MinuteTally

FOLD = "claims"
BEGINNING = datetime(1970, 1, 1, tzinfo=UTC)
MINUTE_TALLY_HOURS = (
    2  # the Metrics page draws the last hour; a minute older than this is deleted by the fold
)


@dataclass(frozen=True)
class Folded:
    since: datetime
    through: datetime
    figures: int  # tally rows touched


def oldest_open_transaction() -> datetime | None:
    """When the oldest transaction still open on this database (other than ours) began, on the test clock's
    offset like every ``at``; None on SQLite (one writer at a time, transactions of milliseconds).

    A record is stamped inside its transaction (``statement_timestamp()``), so no record stamped before this
    instant can still be uncommitted — except a rejection's event, stamped with its request's clock and written in
    a small transaction just after: ``METRICS_FOLD_LAG_SECONDS`` covers that gap. Seeing every session's
    ``xact_start`` needs the same role or ``pg_read_all_stats``; a session we cannot see shows NULL and is covered by
    the lag alone (docs/deployment.md)."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT min(xact_start) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND xact_start IS NOT NULL"
        )
        (started,) = cursor.fetchone()
    return None if started is None else started + clock.offset()


def metrics_fold() -> Folded:
    """Fold every record stamped in ``[through, cut)`` into the tallies and move ``through`` to ``cut``.

    1. Lock the watermark row (FOR UPDATE: two folds at once would count a stretch twice; the second waits and then
       folds only what the first left).
    2. Read the clock after the lock; ``cut`` = the earlier of now and the oldest open transaction's start, less the
       lag — every record stamped before ``cut`` is committed, so none can appear behind the watermark later.
    3. Add the stretch's figures (``tallies.figures``, the definition the scrape uses for what is not folded yet) to
       the tallies, and move the watermark — one transaction, so a scrape sees both or neither.
    """
    with transaction.atomic(durable=True):
        # The migration made the row; a flushed test database has none — made here, and a concurrent maker's row
        # is left alone (ON CONFLICT DO NOTHING) so both then queue on the one row lock.
        MetricFold.objects.bulk_create([MetricFold(name=FOLD, through=BEGINNING)], ignore_conflicts=True)
        fold = MetricFold.objects.select_for_update().get(name=FOLD)
        now = clock.now()
        oldest = oldest_open_transaction()
        cut = min(now, oldest or now) - timedelta(seconds=settings.METRICS_FOLD_LAG_SECONDS)
        since = fold.through
        if cut <= since:
            return Folded(since=since, through=since, figures=0)
        figures = tallies.figures(since=since, until=cut)
        for (family, labels), value in sorted(figures.items()):
            updated = MetricTally.objects.filter(family=family, labels=labels).update(
                value=F("value") + value
            )
            if not updated:  # the only writer of tallies holds the watermark lock: no concurrent insert
                MetricTally.objects.create(family=family, labels=labels, value=value)
        _fold_minutes(since=max(since, cut - timedelta(hours=MINUTE_TALLY_HOURS)), cut=cut)
        MetricFold.objects.filter(name=FOLD).update(through=cut, folded_at=now)
        return Folded(since=since, through=cut, figures=len(figures))


def _fold_minutes(*, since: datetime, cut: datetime) -> None:
    """The per-minute figures of ``[since, cut)`` added to ``MinuteTally`` (under the watermark's lock, its only
    writer), and minutes older than ``MINUTE_TALLY_HOURS`` deleted."""
    if since < cut:
        for (namespace_id, minute, series), value in sorted(
            tallies.per_minute(since=since, until=cut).items()
        ):
            updated = MinuteTally.objects.filter(
                minute=minute, namespace_id=namespace_id, series=series
            ).update(value=F("value") + value)
            if not updated:
                MinuteTally.objects.create(
                    minute=minute, namespace_id=namespace_id, series=series, value=value
                )
    MinuteTally.objects.filter(minute__lt=cut - timedelta(hours=MINUTE_TALLY_HOURS)).delete()
