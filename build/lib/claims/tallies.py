"""The figures /metrics shows, computed over one stretch of time — the one definition the ``fold_metrics`` job folds
into ``MetricTally`` rows and the scrape adds on top of them for the records written since (``metrics.py``).

Every figure is a sum over records stamped in ``[since, until)``: timeline events by ``at``, attempt ends by
``ended_at``. So the fold of ``[a, b)`` plus the figures of ``[b, ∞)`` equal the figures of ``[a, ∞)``, whichever
of the two computes which part. Reads only; costs what the stretch holds, never the whole history (the ``at``
index and the (namespace, ended_at) one bound each scan).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import datetime

from django.db.models import Count, F, OuterRef, QuerySet, Subquery, Sum

from .models import AcceptancePoint, Attempt, AttemptEnd, EventKind, Namespace, Task, TaskEvent

LATENCY_BUCKETS: Sequence[float] = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600)
ATTEMPT_BUCKETS: Sequence[float] = (1, 2, 3, 4, 5, 8, 13)
HISTOGRAMS = {
    "claims_attempts_per_task": ATTEMPT_BUCKETS,
    "claims_reclaim_latency_seconds": LATENCY_BUCKETS,
    "claims_ready_to_commit_seconds": LATENCY_BUCKETS,
}
OUTCOMES = {  # counter family → (its acceptance point, the event kinds that are its success, the success word)
    "claims_claim": (AcceptancePoint.CLAIM, (EventKind.CLAIMED, EventKind.RECLAIMED), "CLAIMED"),
    "claims_renew": (AcceptancePoint.RENEW, (EventKind.RENEWED,), "RENEWED"),
    "claims_commit": (AcceptancePoint.COMMIT, (EventKind.RESULT_COMMITTED,), "COMMITTED"),
}
CONTENTION_REASONS = ("LEASE_LIVE", "VERSION_MISMATCH")

Key = tuple[str, str]  # (family, labels)
Figures = defaultdict[Key, float]


def labels(**pairs: object) -> str:
    return ",".join(f"{k}={'' if v is None else v}" for k, v in pairs.items())


def _bucket(value: float, bounds: Sequence[float]) -> str:
    for bound in bounds:
        if value <= bound:
            return f"le={float(bound)}"
    return "le=+Inf"


def _observe(out: Figures, family: str, value: float) -> None:
    out[(family, _bucket(value, HISTOGRAMS[family]))] += 1
    out[(family, "sum")] += value
    out[(family, "count")] += 1


def _events(since: datetime | None, until: datetime | None) -> QuerySet[TaskEvent]:
    events = TaskEvent.objects.all()
    if since is not None:
        events = events.filter(at__gte=since)
    if until is not None:
        events = events.filter(at__lt=until)
    return events


def _reclaims(events: QuerySet[TaskEvent]) -> Iterator[tuple[int, datetime, float]]:
    """(namespace, at, seconds after the lease it ended ran out) per reclaim of an expired lease."""
    rows = events.filter(kind=EventKind.RECLAIMED).values_list("namespace_id", "at", "detail__previous")
    for namespace_id, at, previous in rows.iterator():
        previous = previous or {}
        expired = previous.get("lease_expires_at")
        if expired and previous.get("ended") == "lease_expired":
            yield namespace_id, at, max(0.0, (at - datetime.fromisoformat(expired)).total_seconds())


def _commits(events: QuerySet[TaskEvent]) -> Iterator[tuple[int, datetime, float | None, int | None]]:
    """(namespace, at, the task's age created → committed, the attempts it took) per canonical commit."""
    attempts = Attempt.objects.filter(task_id=OuterRef("task_id"), started_at__lte=OuterRef("at"))
    commits = events.filter(kind=EventKind.RESULT_COMMITTED).annotate(
        created=Subquery(Task.objects.filter(pk=OuterRef("task_id")).values("created_at")[:1]),
        tries=Subquery(attempts.order_by().values("task_id").annotate(n=Count("pk")).values("n")[:1]),
    )
    for namespace_id, at, created, tries in commits.values_list(
        "namespace_id", "at", "created", "tries"
    ).iterator():
        age = None if created is None else max(0.0, (at - created).total_seconds())
        yield namespace_id, at, age, tries


def figures(*, since: datetime | None, until: datetime | None) -> Figures:
    """Every counter, and every histogram's buckets, sum and count, over records stamped in ``[since, until)``
    (None: unbounded on that side)."""
    out: Figures = defaultdict(float)
    events = _events(since, until)

    # 1. Outcomes at the acceptance points, rejections by point and reason, validation per point. One grouped
    #    scan of the stretch's events.
    rows = events.values("kind", "point", "via", "detail__outcome", "detail__reason").annotate(n=Count("id"))
    for row in rows:
        kind, point, n = row["kind"], row["point"], row["n"]
        for family, (its_point, success, word) in OUTCOMES.items():
            if kind in success:
                out[(family, labels(outcome=word))] += n
            elif kind == EventKind.FENCED and point == its_point:
                out[(family, labels(outcome=row["detail__outcome"] or "FENCED"))] += n
        if kind == EventKind.FENCED:
            out[("claims_fenced", labels(point=point or "", reason=row["detail__reason"] or ""))] += n
            if point == AcceptancePoint.CLAIM and row["detail__reason"] in CONTENTION_REASONS:
                out[("claims_contention", "")] += n
        if point:
            validated = "true" if row["via"] == "" else "false"
            out[("claims_validation", labels(point=point, validated=validated))] += n

    # 2. Reclaim latency: a reclaim's time after the lease it ended ran out.
    for _, _, lateness in _reclaims(events):
        _observe(out, "claims_reclaim_latency_seconds", lateness)

    # 3. At each canonical commit: the task's age (created READY → committed) and how many attempts it took.
    for _, _, age, tries in _commits(events):
        if age is not None:
            _observe(out, "claims_ready_to_commit_seconds", age)
        _observe(out, "claims_attempts_per_task", tries or 0)

    # 4. Compute discarded: attempts that ended in the stretch without committing.
    # One index range per namespace on (namespace, ended_at): no index of its own on ended_at, which every attempt's
    # end would pay for.
    namespaces = list(Namespace.objects.values_list("pk", flat=True))
    ended = Attempt.objects.filter(namespace_id__in=namespaces, ended_at__isnull=False).exclude(
        end_reason=AttemptEnd.COMMITTED
    )
    if since is not None:
        ended = ended.filter(ended_at__gte=since)
    if until is not None:
        ended = ended.filter(ended_at__lt=until)
    held = ended.aggregate(total=Sum(F("ended_at") - F("started_at")))["total"]
    if held:
        out[("claims_discarded_compute_seconds", "")] += held.total_seconds()
    return out


# --- per minute: what the console's Metrics page draws -----------------------------------------------------------

MINUTE_COUNTS = {  # series → (acceptance point, event kinds)
    "claims": (AcceptancePoint.CLAIM, (EventKind.CLAIMED, EventKind.RECLAIMED)),
    "commits": (AcceptancePoint.COMMIT, (EventKind.RESULT_COMMITTED,)),
    "fenced commits": (AcceptancePoint.COMMIT, (EventKind.FENCED,)),
}
MinuteKey = tuple[int, datetime, str]  # (namespace id, the minute, series)


def minute_of(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def per_minute(*, since: datetime, until: datetime) -> defaultdict[MinuteKey, float]:
    """The Metrics page's figures over records stamped in ``[since, until)``, per namespace and minute: the counts
    of ``MINUTE_COUNTS``, and the reclaim-latency and ready→commit buckets (``reclaim:le=…``, ``ready:le=…``, not
    cumulative). Additive over stretches, as ``figures`` is: the fold keeps them in ``MinuteTally``."""
    out: defaultdict[MinuteKey, float] = defaultdict(float)
    events = _events(since, until)
    counted = events.filter(point__in=[AcceptancePoint.CLAIM, AcceptancePoint.COMMIT]).values_list(
        "namespace_id", "point", "kind", "at"
    )
    for namespace_id, point, kind, at in counted.iterator():
        for series, (its_point, kinds) in MINUTE_COUNTS.items():
            if point == its_point and kind in kinds:
                out[(namespace_id, minute_of(at), series)] += 1
    for namespace_id, at, lateness in _reclaims(events):
        out[(namespace_id, minute_of(at), "reclaim:" + _bucket(lateness, LATENCY_BUCKETS))] += 1
    for namespace_id, at, age, _ in _commits(events):
        if age is not None:
            out[(namespace_id, minute_of(at), "ready:" + _bucket(age, LATENCY_BUCKETS))] += 1
    return out
