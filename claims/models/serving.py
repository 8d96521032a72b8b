"""The database history the control plane has served from (issue 39: a failover is a fence)."""

from __future__ import annotations

from django.db import models


class ServedHistory(models.Model):
    """One row each time the control plane finds the PostgreSQL it serves from in a new state: another cluster
    (``system_identifier``), another timeline (a standby was promoted), or its synchronous replication switched on
    or off. Appended by ``services.serving.serving_check`` and never changed.

    The latest row is what every decision checks before it is made: the statement that takes a decision's locks
    also calls ``claims_serving_check()`` (migration 0024), which refuses to go on — SQLSTATE P0F01 — while the
    live timeline or synchronous state differs from it. ``fenced``: the new history may lack acknowledged decisions
    (the earlier one was not synchronous, or ``DATABASE_FAILOVER_FENCE=always``), so every namespace's epoch was
    bumped in the transaction that appended this row.

    Not managed by Django: like ``django_migrations`` it describes the database, not the data, so a test's flush
    leaves it in place (migration 0024 creates it and its first row)."""

    system_identifier = models.CharField(max_length=20)
    timeline = models.PositiveIntegerField()
    synchronous = models.BooleanField()
    seen_at = models.DateTimeField()
    fenced = models.BooleanField(default=False)
    cause = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        managed = False
        db_table = "claims_servedhistory"

    def __str__(self) -> str:
        return f"timeline {self.timeline} of {self.system_identifier}"
