"""The on-call tools' reads: live leases and the drain figures, the incident header, fence history, the pools page
and the namespace overview. Nothing here writes. What an app wrapping the core adds (the rollout's stage, its
legacy leases, its worker registrations) comes through ``oncall.extensions``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Count

from claims import clock
from claims.database import database_state
from claims.models import (
    AcceptancePoint,
    Attempt,
    AuditEntry,
    Effect,
    EffectState,
    EventKind,
    Namespace,
    Principal,
    Role,
    StagedResult,
    Task,
    TaskEvent,
    TaskState,
)
from claims.selectors import read_minutes
from claims.tallies import LATENCY_BUCKETS, MINUTE_COUNTS
from claims.ui import chart

from . import extensions
from .models import FenceRequest


def age_seconds(at: datetime | None, now: datetime | None = None) -> float | None:
    return None if at is None else round(((now or clock.now()) - at).total_seconds(), 1)


@dataclass(frozen=True)
class Lease:
    """One live lease: a claim.v1 attempt unexpired and not fenced, or one an app holds outside claim.v1 (the
    rollout's legacy-API claims, ``extensions.extra_leases``)."""

    namespace: str
    task_id: str
    owner_id: str
    pool: str
    via: str  # "claim.v1", or the protocol a passed-on request came by ("legacy")


def live_tasks(namespace: Namespace, now: datetime) -> Any:
    """The namespace's tasks whose claim.v1 lease is live: claimed, unexpired, granted in the current epoch."""
    return Task.objects.filter(
        namespace=namespace,
        state=TaskState.CLAIMED,
        lease_expires_at__gt=now,
        scheduler_epoch=namespace.scheduler_epoch,  # a fence ended every lease granted before it
    )


def live_leases(namespace: Namespace, *, pool: str | None = None, now: datetime | None = None) -> list[Lease]:
    """The namespace's live leases — of one pool or all. The one definition the drain, its gate and the Pools page
    count: as many as the live work, whatever the history."""
    now = now or clock.now()
    attempts = Attempt.objects.filter(attempt_id__in=live_tasks(namespace, now).values("attempt_id"))
    if pool is not None:
        attempts = attempts.filter(pool=pool)
    rows = list(attempts.values_list("attempt_id", "task_id", "owner_id", "pool"))
    # An attempt granted to a request passed on from another protocol (the rollout's legacy API judged by claim.v1:
    # its claim event's ``via``) is that protocol's lease, not a claim.v1 worker's.
    passed_on = dict(
        TaskEvent.objects.filter(
            attempt_id__in=[row[0] for row in rows], kind__in=[EventKind.CLAIMED, EventKind.RECLAIMED]
        )
        .exclude(via="")
        .values_list("attempt_id", "via")
    )
    leases = [
        Lease(namespace.name, task_id, owner, attempt_pool, passed_on.get(attempt_id, "claim.v1"))
        for attempt_id, task_id, owner, attempt_pool in rows
    ]
    return leases + extensions.leases_of(namespace, now, pool)


def drain_counts(
    namespace: Namespace, *, pool: str | None = None, now: datetime | None = None
) -> dict[str, int]:
    """Live leases (``live_leases``), UNKNOWN effects, and staged results of live attempts not yet committed — of
    one pool or all."""
    now = now or clock.now()
    leases = live_leases(namespace, pool=pool, now=now)
    live_attempts = Attempt.objects.filter(attempt_id__in=live_tasks(namespace, now).values("attempt_id"))
    if pool is not None:
        live_attempts = live_attempts.filter(pool=pool)
    unknown = Effect.objects.filter(namespace=namespace, state=EffectState.UNKNOWN)
    if pool is not None:
        unknown = unknown.filter(task__attempts__pool=pool).distinct()
    awaiting = StagedResult.objects.filter(canonical=False, attempt_id__in=live_attempts.values("attempt_id"))
    return {
        "active_leases": len(leases),
        "unknown_effects": unknown.count(),
        "awaiting_commit": awaiting.count(),
    }


def fence_history(namespace: str, *, limit: int = 10) -> list[dict[str, Any]]:
    """The namespace's epoch fences, newest first — from the console, the API, the CLI, a rollback or a job: every
    one is audited as ``epoch_fence`` — with the requests that have not fenced yet, and beside a requested fence
    its self-check (pending until its job has checked)."""
    requests = {
        str(r.fence_id): r
        for r in FenceRequest.objects.filter(namespace=namespace).order_by("-requested_at")[:limit]
    }
    rows: list[dict[str, Any]] = [
        {
            "at": r.requested_at,
            "principal": r.principal,
            "reason": r.reason,
            "epoch": None,
            "hold": "",
            "request": r,
            "fenced_attempts": None,
        }
        for r in requests.values()
        if r.scheduler_epoch is None
    ]
    fences = AuditEntry.objects.filter(namespace=namespace, action="epoch_fence").order_by("-id")[:limit]
    for entry in fences:
        request = (
            requests.get(entry.target.removeprefix("fence:")) if entry.target.startswith("fence:") else None
        )
        rows.append(
            {
                "at": entry.at,
                "principal": entry.principal,
                "reason": entry.reason,
                "epoch": entry.detail.get("scheduler_epoch"),
                "hold": entry.detail.get("hold", ""),
                "request": request,
                "fenced_attempts": entry.detail.get("fenced_attempts"),
            }
        )
    rows.sort(key=lambda row: row["at"], reverse=True)
    return rows[:limit]


def incident(namespace: Namespace, now: datetime | None = None) -> dict[str, Any]:
    """What an on-call engineer needs first about a namespace: its epoch; if claims are paused, since when, by whom
    and why (the fence that paused them); whether the jobs run — fence requests waiting past
    FENCE_RESEND_AFTER_SECONDS mean the job queue or beat is not keeping up — and what the installed apps add
    (the rollout: the stage, a rollback under way and what its drain waits on, a stale drain check)."""
    now = now or clock.now()
    paused_by = None
    if namespace.claims_paused:
        paused_by = (
            AuditEntry.objects.filter(namespace=namespace.name, action="epoch_fence").order_by("-id").first()
        )
    waiting = list(
        FenceRequest.objects.filter(namespace=namespace.name, finished_at__isnull=True).values_list(
            "requested_at", flat=True
        )
    )
    oldest_wait = age_seconds(min(waiting), now) if waiting else None
    refused = refused_since(namespace, paused_by.at, now) if paused_by is not None else None
    last_request = FenceRequest.objects.filter(namespace=namespace.name).order_by("-requested_at").first()
    facts = extensions.facts_of(namespace, now)
    behind = []
    if oldest_wait is not None and oldest_wait > settings.FENCE_RESEND_AFTER_SECONDS:
        behind.append(f"a fence's self-check has waited {oldest_wait:.0f} s for its job")
    return {
        "stage": None,
        "gate": None,
        "rollback": None,
        "rollback_waits_on": None,
        "last_drain_check_age": None,
        **facts,
        "epoch": namespace.scheduler_epoch,
        "paused": namespace.claims_paused,
        "hold": namespace.pause_hold,
        "paused_by": paused_by,
        "refused_since_fence": refused,
        "check_failed": last_request is not None and last_request.status == "CHECK_FAILED",
        "fences_waiting": len(waiting),
        "jobs_behind": behind + facts["jobs_behind"],
        "database": database_state(),
    }


def refused_since(namespace: Namespace, since: datetime, now: datetime) -> dict[str, Any]:
    """Requests refused at each acceptance point in ``[since, now]`` — what a fence has stopped since it was made —
    read by the timeline's (namespace, point, at) index, and counted by the contract's outcome word too: FENCED by
    its reason (EPOCH: a worker from before the fence), CLAIMS_PAUSED apart (idle workers asking a paused namespace
    for work), and any other refusal by its own word."""
    rows = (
        TaskEvent.objects.filter(
            namespace_id=namespace.id,
            point__in=AcceptancePoint.values,
            at__gte=since,
            at__lte=now,
            kind="fenced",
        )
        .values_list("point", "detail__outcome", "detail__reason")
        .annotate(n=Count("id"))
    )
    points: dict[str, int] = {}
    words: dict[str, int] = {}
    for point, outcome, reason, n in rows:
        points[point] = points.get(point, 0) + n
        word = f"{outcome} ({reason})" if outcome == "FENCED" and reason else (outcome or "refused")
        words[word] = words.get(word, 0) + n
    return {
        "total": sum(points.values()),
        "fenced": sum(n for word, n in words.items() if word.startswith("FENCED")),
        "by_word": dict(sorted(words.items(), key=lambda item: (-item[1], item[0]))),
        **{point: points.get(point, 0) for point in AcceptancePoint.values},
    }


def overview(now: datetime | None = None) -> list[dict[str, Any]]:
    """The incident board: every namespace's incident facts (``incident``: epoch, pause and who and why, the gate,
    the rollback and what it waits on, self-checks waiting, jobs behind) and its drain figures, read at one clock;
    by urgency (``_urgency``), then those whose gate holds, then the rest, by name."""
    now = now or clock.now()
    rows = [
        {"ns": ns, "drain": drain_counts(ns, now=now), **incident(ns, now)}
        for ns in Namespace.objects.order_by("name")
    ]
    for row in rows:
        row["trouble"] = _trouble(row)
        row["can_advance"] = bool(row.get("gate") and row["gate"].holds and not row["rollback"])
    return sorted(rows, key=_urgency)


def _urgency(row: dict[str, Any]) -> tuple[Any, ...]:
    """The board's order: namespaces in trouble first — among them those with a stale writer's commit accepted
    (stale authority is acting), then a rollback whose drain has not moved longest (claims stay paused until it
    ends: an outage), then the one whose oldest unexplained mismatch has waited longest — then those whose gate
    holds, then by name."""
    return (
        not row["trouble"],
        not row.get("stale_writers"),
        -(row.get("drain_stalled_for") or 0),
        -(row.get("oldest_mismatch_age") or 0),
        not row["can_advance"],
        row["ns"].name,
    )


def _trouble(row: dict[str, Any]) -> list[str]:
    """Why a namespace needs someone now — each reason in a few words."""
    reasons = []
    if row["paused"]:
        reasons.append("claims paused")
    if row["rollback"]:
        reasons.append("rollback under way")
    if row.get("drain_stalled_for"):
        reasons.append(f"its drain has not moved for {row['drain_stalled_for'] / 60:.0f} min")
    if row["jobs_behind"]:
        reasons.append("jobs behind")
    if row.get("mismatches"):
        reasons.append(f"{row['mismatches']} mismatch{'es' if row['mismatches'] != 1 else ''} to review")
    if row["drain"]["unknown_effects"]:
        reasons.append(
            f"{row['drain']['unknown_effects']} UNKNOWN effect{'s' if row['drain']['unknown_effects'] != 1 else ''}"
        )
    if row["check_failed"]:
        reasons.append("a fence's self-check failed")
    return reasons


def pools_page(now: datetime | None = None, *, namespace: str = "") -> dict[str, Any]:
    """What the Pools page shows: per namespace and pool the live leases held (``live_leases``: the drain's
    figure), by the protocol that holds them, and the workers — the installed apps' rows (the rollout's
    registrations), else every worker principal — each with the live leases it holds; of one namespace, or all."""
    now = now or clock.now()
    held: dict[tuple[str, str], int] = {}
    by_pool: dict[tuple[str, str], dict[str, int]] = {}
    namespaces = Namespace.objects.order_by("name")
    if namespace:
        namespaces = namespaces.filter(name=namespace)
    for ns in namespaces:
        for lease in live_leases(ns, now=now):
            held[(lease.namespace, lease.owner_id)] = held.get((lease.namespace, lease.owner_id), 0) + 1
            counts = by_pool.setdefault((lease.namespace, lease.pool), {"claim.v1": 0, "legacy": 0})
            counts[lease.via] = counts.get(lease.via, 0) + 1
    workers = extensions.workers_of(now, held)
    if workers is None:
        by_owner: dict[str, int] = {}
        for (_, owner), count in held.items():
            by_owner[owner] = by_owner.get(owner, 0) + count
        workers = [
            {"principal": p.name, "pool": p.pool, "held": by_owner.get(p.owner_id, 0)}
            for p in Principal.objects.filter(role=Role.WORKER).order_by("pool", "name")
        ]
    pools = [
        {
            "namespace": ns,
            "pool": pool or "—",
            "v1": c["claim.v1"],
            "legacy": c["legacy"],
            "total": sum(c.values()),
        }
        for (ns, pool), c in sorted(by_pool.items())
    ]
    if namespace:
        workers = [row for row in workers if row.get("reg") is None or row["reg"].namespace == namespace]
    return {
        "workers": workers,
        "pools": pools,
        "taken_at": now,
        "stale_after": settings.WORKER_STALE_SECONDS,
        "namespace": namespace,
    }


def glance(now: datetime, minutes: int = 60) -> dict[str, Any]:
    """The Metrics page over the last ``minutes`` up to ``now``: claims and fenced commits per minute, the reclaim
    latencies and ready→commit times as histograms (p95 as its bucket's bound, as Prometheus' histogram_quantile
    would bound it), UNKNOWN effects, and each namespace's claims, commits and fenced commits per minute — all from
    the per-minute tallies (``claims.metrics.read_minutes``)."""
    window, figures = read_minutes(now=now, minutes=minutes)
    slot = {minute: i for i, minute in enumerate(window)}
    names = dict(Namespace.objects.order_by("name").values_list("id", "name"))
    per_ns = {ns_id: {series: [0] * minutes for series in MINUTE_COUNTS} for ns_id in names}
    buckets: dict[str, dict[str, float]] = {"reclaim": {}, "ready": {}}
    for (ns_id, minute, series), value in figures.items():
        if series in MINUTE_COUNTS and ns_id in per_ns and minute in slot:
            per_ns[ns_id][series][slot[minute]] += int(value)
        elif ":" in series:
            family, bucket = series.split(":", 1)
            buckets[family][bucket] = buckets[family].get(bucket, 0) + value
    total = {
        series: [sum(ns[series][i] for ns in per_ns.values()) for i in range(minutes)]
        for series in MINUTE_COUNTS
    }
    labels = [f"-{minutes - i} min" for i in range(minutes)]
    return {
        "claims_chart": _minutes_chart(labels, {"claims": total["claims"]}),
        "claims_total": sum(total["claims"]),
        "fenced_chart": _minutes_chart(labels, {"fenced commits": total["fenced commits"]}),
        "fenced_total": sum(total["fenced commits"]),
        "reclaim": _histogram(buckets["reclaim"], "reclaims"),
        "ready": _histogram(buckets["ready"], "commits"),
        "unknown": Effect.objects.filter(state=EffectState.UNKNOWN).count(),
        "activity": [
            (names[ns_id], chart(kind="line", labels=labels, series=series, x="minutes ago", y="per minute"))
            for ns_id, series in sorted(per_ns.items(), key=lambda item: names[item[0]])
        ],
    }


def _minutes_chart(labels: list[str], series: dict[str, list[int]]) -> dict[str, Any]:
    return chart(kind="bar", labels=labels, series=series, x="minutes ago", y="per minute")


def _histogram(counts: dict[str, float], what: str) -> dict[str, Any]:
    """A latency histogram over ``LATENCY_BUCKETS`` (counts not cumulative), its total and its p95's bucket bound."""
    bounds = [f"le={float(b)}" for b in LATENCY_BUCKETS] + ["le=+Inf"]
    values = [int(counts.get(b, 0)) for b in bounds]
    labels = [f"≤ {b:g} s" for b in LATENCY_BUCKETS] + [f"> {LATENCY_BUCKETS[-1]:g} s"]
    total, running, p95 = sum(values), 0, None
    for label, value in zip(labels, values, strict=True):
        running += value
        if total and p95 is None and running >= 0.95 * total:
            p95 = label
    return {
        "total": total,
        "p95": p95,
        "chart": chart(kind="bar", labels=labels, series={what: values}, x="seconds", y=what),
    }
