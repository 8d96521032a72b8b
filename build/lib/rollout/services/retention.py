"""The rollout's side of retention (claims/services/retention.py has the core's and the rules): what the rollout
records per operation or per beat — compared operations, gate evaluations, drain snapshots, the legacy store's
events — is deleted once older than RETENTION_SECONDS, which settings keep longer than the rollout window, so no
gate or coverage figure loses a record it counts. Kept whatever their age: the newest gate evaluation of each move
and the two newest drain snapshots of each pool (the gates and the console read them), and the legacy events of a
task with a mismatch under review. Mismatches, stage changes, rollbacks, fences and waivers are the rollout's
history and are never pruned."""

from __future__ import annotations

import time
from datetime import timedelta

from django.conf import settings
from django.db.models import OuterRef, QuerySet, Subquery

from claims import clock
from claims.services.retention import delete_batch, keep_tasks

from ..models import (
    ComparedOperation,
    DrainSnapshot,
    GateEvaluation,
    LegacyEvent,
    Mismatch,
    MismatchStatus,
)


@keep_tasks
def _under_review() -> QuerySet:
    """The core keeps every record of these tasks: the mismatch drill-down shows both timelines."""
    return Mismatch.objects.filter(status__in=[MismatchStatus.OPEN, MismatchStatus.BUG]).values("task_id")


def rollout_history_prune(*, budget_seconds: float = 30.0) -> dict[str, int | bool]:
    """Delete, batch by batch (each its own short transaction), what the module docstring allows."""
    out: dict[str, int | bool] = {"more": False}
    if not settings.RETENTION_SECONDS:
        return out
    cutoff = clock.now() - timedelta(seconds=settings.RETENTION_SECONDS)
    deadline = time.monotonic() + budget_seconds
    newest_gate = GateEvaluation.objects.filter(
        namespace=OuterRef("namespace"), move=OuterRef("move")
    ).order_by("-at", "-id")
    newest_snapshots = DrainSnapshot.objects.filter(
        namespace=OuterRef("namespace"), pool=OuterRef("pool")
    ).order_by("-taken_at", "-id")
    steps = {
        "compared_operations": lambda: ComparedOperation.objects.filter(at__lt=cutoff).order_by("at"),
        "gate_evaluations": lambda: (
            GateEvaluation.objects.filter(at__lt=cutoff)
            .exclude(pk=Subquery(newest_gate.values("pk")[:1]))
            .order_by("at")
        ),
        "drain_snapshots": lambda: (
            DrainSnapshot.objects.filter(taken_at__lt=cutoff)
            .exclude(pk=Subquery(newest_snapshots.values("pk")[:1]))
            .exclude(pk=Subquery(newest_snapshots.values("pk")[1:2]))
            .order_by("taken_at")
        ),
        "legacy_events": lambda: (
            LegacyEvent.objects.filter(at__lt=cutoff).exclude(task_id__in=_under_review()).order_by("at")
        ),
    }
    for name, rows in steps.items():
        out[name] = 0
        while True:
            if time.monotonic() > deadline:
                out["more"] = True
                return out
            deleted = delete_batch(rows(), settings.RETENTION_BATCH)
            out[name] = int(out[name]) + deleted
            if deleted < settings.RETENTION_BATCH:
                break
    return out
