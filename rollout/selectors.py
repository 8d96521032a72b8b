"""Rollout reads: the window, validation coverage, compared operations, mismatches, drain counts, workers.
The gates, the API and the dashboard share these, so a figure means the same everywhere."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Q

from claims import clock
from claims.models import (
    AcceptancePoint,
    Attempt,
    Effect,
    EffectState,
    Namespace,
    StagedResult,
    Task,
    TaskEvent,
    TaskState,
)

from .legacy import legacy_store
from .models import (
    ComparedOperation,
    CoverageWaiver,
    Mismatch,
    MismatchStatus,
    StageChange,
    WorkerRegistration,
)

POINTS = [point.value for point in AcceptancePoint]


def stage_started_at(namespace: Namespace) -> datetime:
    change = (
        StageChange.objects.filter(namespace=namespace.name)
        .order_by("-at")
        .values_list("at", flat=True)
        .first()
    )
    return change or namespace.created_at


def window_start(namespace: Namespace, now: datetime | None = None) -> datetime:
    """The later of the stage's start and now − ROLLOUT_WINDOW_SECONDS."""
    now = now or clock.now()
    return max(stage_started_at(namespace), now - timedelta(seconds=settings.ROLLOUT_WINDOW_SECONDS))


def coverage(namespace: Namespace, now: datetime | None = None) -> dict[str, Any]:
    """Per acceptance point: requests that reached it (total) and those whose epoch and generation claim.v1
    checked (validated), over the window. A point with no traffic is covered only when waived."""
    now = now or clock.now()
    start = window_start(namespace, now)
    rows = (
        TaskEvent.objects.filter(namespace_id=namespace.id, point__isnull=False, at__gte=start, at__lte=now)
        .values("point")
        .annotate(total=Count("id"), validated=Count("id", filter=Q(validated=True)))
    )
    counts = {row["point"]: row for row in rows}
    waived = set(
        CoverageWaiver.objects.filter(
            namespace=namespace.name, at__gte=stage_started_at(namespace)
        ).values_list("point", flat=True)
    )
    points = {}
    for point in POINTS:
        total = counts.get(point, {}).get("total", 0)
        validated = counts.get(point, {}).get("validated", 0)
        points[point] = {
            "validated": validated,
            "total": total,
            "ratio": round(validated / total, 4) if total else None,
            "waived": point in waived,
        }
    return {"window_start": start, "points": points}


def compared_count(namespace: Namespace, now: datetime | None = None) -> int:
    start = window_start(namespace, now)
    return ComparedOperation.objects.filter(namespace=namespace.name, at__gte=start).count()


def mismatch_counts(namespace: Namespace) -> dict[str, int]:
    rows = Mismatch.objects.filter(namespace=namespace.name).values("status").annotate(n=Count("id"))
    by = {row["status"]: row["n"] for row in rows}
    return {"open": by.get(MismatchStatus.OPEN, 0), "bug": by.get(MismatchStatus.BUG, 0)}


def drain_counts(
    namespace: Namespace, *, pool: str | None = None, now: datetime | None = None
) -> dict[str, int]:
    """Live leases (claim.v1 attempts unexpired and not fenced, plus legacy-API claims unexpired and not
    completed), UNKNOWN effects, and staged results of live attempts not yet committed — of one pool or all."""
    now = now or clock.now()
    live = Task.objects.filter(
        namespace=namespace,
        state=TaskState.CLAIMED,
        lease_expires_at__gt=now,
        scheduler_epoch=namespace.scheduler_epoch,
    )
    live_attempts = Attempt.objects.filter(attempt_id__in=live.values("attempt_id"))
    if pool is not None:
        live_attempts = live_attempts.filter(pool=pool)
    # Legacy-API claims, once: not claim.v1's own decisions written through, and not a claim that also lives in
    # claim.v1 as the same owner's live attempt (imported on entering SHADOW, or mirrored) — counted above.
    v1_holders = set(live.values_list("task_id", "owner_id"))
    legacy_live = [
        row
        for row in legacy_store().live_claims(namespace=namespace.name, now=now, pool=pool)
        if row.via == "legacy" and (row.task_id, row.owner_id) not in v1_holders
    ]
    unknown = Effect.objects.filter(namespace=namespace, state=EffectState.UNKNOWN)
    if pool is not None:
        unknown = unknown.filter(task__attempts__pool=pool).distinct()
    awaiting = StagedResult.objects.filter(canonical=False, attempt_id__in=live_attempts.values("attempt_id"))
    return {
        "active_leases": live_attempts.count() + len(legacy_live),
        "unknown_effects": unknown.count(),
        "awaiting_commit": awaiting.count(),
    }


def fresh_v1_workers(namespace: Namespace, now: datetime | None = None) -> int:
    now = now or clock.now()
    return WorkerRegistration.objects.filter(
        namespace=namespace.name,
        protocol="claim.v1",
        refused=False,
        last_heartbeat__gte=now - timedelta(seconds=settings.WORKER_STALE_SECONDS),
    ).count()
