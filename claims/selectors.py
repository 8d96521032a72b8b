"""Reads. The API, the dashboard and the rollout gates share these, so a number means the same everywhere."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Exists, OuterRef, QuerySet

from . import clock, interleave, tallies
from .errors import NotFound
from .models import (
    Attempt,
    AttemptEnd,
    AuditEntry,
    DispatchIntent,
    DispatchState,
    Effect,
    EffectState,
    EventKind,
    JobRun,
    MetricFold,
    MinuteTally,
    Namespace,
    ResourceKey,
    StagedResult,
    Task,
    TaskEvent,
    TaskState,
)
from .tallies import MinuteKey


def task_get(*, task_id: str) -> Task:
    task = Task.objects.select_related("namespace").filter(pk=task_id).first()
    if task is None:
        raise NotFound("no such task")
    return task


def task_list(*, namespace: str | None = None, state: str | None = None) -> QuerySet[Task]:
    tasks = Task.objects.select_related("namespace").order_by("created_at", "task_id")
    if namespace:
        tasks = tasks.filter(namespace__name=namespace)
    if state:
        tasks = tasks.filter(state=state)
    return tasks


def task_events(*, task_id: str) -> QuerySet[TaskEvent]:
    if not Task.objects.filter(pk=task_id).exists():
        raise NotFound("no such task")
    return TaskEvent.objects.filter(task_id=task_id).order_by("id")


def namespace_get(*, name: str) -> Namespace:
    namespace = Namespace.objects.filter(name=name).first()
    if namespace is None:
        raise NotFound(f"no such namespace: {name}")
    return namespace


def fence_epoch_of(fence_id: Any) -> int | None:
    """The epoch the fence ``fence_id`` started (``services.epoch_fence(fence_id=…)``), or None if it has not
    happened yet."""
    entry = AuditEntry.objects.filter(action="epoch_fence", target=f"fence:{fence_id}").first()
    return entry.detail["scheduler_epoch"] if entry else None


def namespace_list() -> QuerySet[Namespace]:
    return Namespace.objects.order_by("name")


def live_claims(namespace: Namespace, *, now: Any = None) -> QuerySet[Task]:
    """Tasks whose claim is live: CLAIMED, unexpired, granted under the namespace's current epoch."""
    now = now or clock.now()
    return Task.objects.filter(
        namespace=namespace,
        state=TaskState.CLAIMED,
        lease_expires_at__gt=now,
        scheduler_epoch=namespace.scheduler_epoch,
    )


def namespace_drain(namespace: Namespace) -> dict[str, int]:
    """What still runs in a namespace: live leases, UNKNOWN effects, staged results of live attempts that are
    not yet committed."""
    now = clock.now()
    live = live_claims(namespace, now=now)
    awaiting = StagedResult.objects.filter(canonical=False, attempt_id__in=live.values("attempt_id"))
    return {
        "active_leases": live.count(),
        "unknown_effects": Effect.objects.filter(namespace=namespace, state=EffectState.UNKNOWN).count(),
        "awaiting_commit": awaiting.count(),
    }


# --- figures shared by /metrics and the console (one selector per number) -------------------------------------


def unknown_effects_count() -> int:
    return Effect.objects.filter(state=EffectState.UNKNOWN).count()


def next_lease_expiry(*, namespace: str, node_ids: list[str] | None = None) -> datetime | None:
    """When the next lease that could give this waiter a task runs out, or None: a waiting claim wakes then even if
    nothing is notified (an expiry is a change nobody writes). Only leases still running count — one that already
    ran out is the retry's business, not the timer's (a waiter that cannot take that task must not re-poll for it)
    — of tasks of the waiter's nodes, and of the attempts holding keys that its READY tasks list (in any
    namespace): their expiry frees the key."""
    now = clock.now()
    own = Task.objects.filter(namespace__name=namespace, state=TaskState.CLAIMED, lease_expires_at__gt=now)
    listing = Task.objects.filter(namespace__name=namespace, state=TaskState.READY, has_resources=True)
    if node_ids:
        own = own.filter(node_id__in=node_ids)
        listing = listing.filter(node_id__in=node_ids)
    holders = Task.objects.filter(
        state=TaskState.CLAIMED,
        lease_expires_at__gt=now,
        attempt_id=OuterRef("holder_attempt_id"),
        task_id=OuterRef("holder_task_id"),
    )
    keys = ResourceKey.objects.filter(
        Exists(holders), task_links__task__in=listing.values("task_id")
    ).values_list("holder_task_id", flat=True)
    expiries = [
        own.order_by("lease_expires_at").values_list("lease_expires_at", flat=True).first(),
        Task.objects.filter(pk__in=keys, lease_expires_at__gt=now)
        .order_by("lease_expires_at")
        .values_list("lease_expires_at", flat=True)
        .first(),
    ]
    return min((at for at in expiries if at is not None), default=None)


AUDIT_PAGE = 100


# The audit log's records of the work itself — one per task created, cancelled, revised, requeued, per resource —
# which outnumber the control actions (fences, resumes, stage moves, reviews, reconciles …) a hundred to one.
WORK_ACTIONS = (
    "task_create",
    "task_cancel",
    "task_revise_input",
    "task_requeue",
    "resource_create",
    "resource_delete",
)


def audit_entries(
    *,
    namespace: str = "",
    action: str = "",
    principal: str = "",
    before: int | None = None,
    with_work: bool = False,
) -> tuple[list[AuditEntry], int | None]:
    """A page of the audit log, newest first, filtered by namespace, action and principal (exact) — the control
    actions only unless ``with_work`` (or an ``action`` of the work is asked for by name) — and the id to pass as
    ``before`` for the next older page (None at the end). Keyset on the id: a page costs the same however long the
    log."""
    rows = AuditEntry.objects.order_by("-id")
    if not with_work and not action:
        rows = rows.exclude(action__in=WORK_ACTIONS)
    if namespace:
        rows = rows.filter(namespace=namespace)
    if action:
        rows = rows.filter(action=action)
    if principal:
        rows = rows.filter(principal=principal)
    if before is not None:
        rows = rows.filter(id__lt=before)
    page = list(rows[: AUDIT_PAGE + 1])
    older = page[AUDIT_PAGE - 1].id if len(page) > AUDIT_PAGE else None
    return page[:AUDIT_PAGE], older


def audit_actions() -> list[str]:
    """The actions the audit log has recorded, for the filter's choices."""
    return sorted(AuditEntry.objects.order_by().values_list("action", flat=True).distinct())


LANE_MARKS: dict[str, str] = {
    EventKind.RENEWED: "renewed",
    EventKind.LEASE_EXPIRED: "lease expired",
    EventKind.RELEASED: "released",
    EventKind.RESULT_STAGED: "staged",
    EventKind.RESULT_COMMITTED: "committed",
    EventKind.FENCED: "refused",
    EventKind.EFFECT_PREPARED: "effect prepared",
    EventKind.EFFECT_UNKNOWN: "effect unknown",
    EventKind.EFFECT_COMMITTED: "effect committed",
    EventKind.DISPATCH_RECORDED: "dispatch",
}


def _lease_expiries(events: list[TaskEvent], task: Task) -> dict[Any, datetime]:
    """Each attempt's last lease expiry: from its claim and renewals (their events carry it), and the task row's
    for its current attempt."""
    out: dict[Any, datetime] = {}
    for event in events:
        expires = (event.detail or {}).get("lease_expires_at")
        if (
            event.attempt_id
            and expires
            and event.kind in (EventKind.CLAIMED, EventKind.RECLAIMED, EventKind.RENEWED)
        ):
            moment = datetime.fromisoformat(expires)
            out[event.attempt_id] = max(out.get(event.attempt_id, moment), moment)
    if task.attempt_id is not None and task.lease_expires_at is not None:
        out[task.attempt_id] = task.lease_expires_at
    return out


def task_lanes(*, task: Task, now: datetime | None = None) -> dict[str, Any]:
    """A task's history as lanes, one per attempt (Temporal Web's way): when it held the task, how it ended, and its
    own events as marks on one time axis — from the task's creation to its last event (or now, while it runs).

    An attempt is *holding* only while it is the task's current one, CLAIMED, unexpired and of the namespace's
    current epoch; an attempt granted before a fence is shown *fenced*, never holding, whatever its row says."""
    now = now or clock.now()
    events = list(TaskEvent.objects.filter(task_id=task.task_id).order_by("id"))
    attempts = list(task.attempts.order_by("claim_generation"))
    epoch = task.namespace.scheduler_epoch
    start = task.created_at
    ends = [e.at for e in events] + [a.ended_at or now for a in attempts]
    if task.state == TaskState.CLAIMED:
        ends.append(now)
    end = max([start, *ends])
    span = max((end - start).total_seconds(), 0.001)

    def at(moment: datetime) -> float:
        return round(100 * max(0.0, (moment - start).total_seconds()) / span, 2)

    expiries = _lease_expiries(events, task)

    lanes = []
    for a in attempts:
        holding = (
            task.attempt_id == a.attempt_id
            and task.state == TaskState.CLAIMED
            and a.ended_at is None
            and task.lease_expires_at is not None
            and task.lease_expires_at > now
            and a.scheduler_epoch == epoch
        )
        fenced = a.end_reason == "FENCED" or (a.ended_at is None and a.scheduler_epoch < epoch)
        if holding:
            status = "holding"
        elif fenced:
            status = "fenced"
        elif a.ended_at is None:
            status = "lapsed"  # its lease ran out and nobody has taken the task since
        else:
            status = (a.end_reason or "").lower()
        # Held until it ended or its lease ran out, whichever came first: an attempt reclaimed after its expiry
        # did not hold the task in between (the lane drew it held 2.6 s past its expiry).
        finished = min(a.ended_at or now, expiries.get(a.attempt_id) or now)
        marks = [
            {
                "label": LANE_MARKS[e.kind]
                + (
                    f" {e.detail.get('outcome', '')} {e.detail.get('reason', '')}".rstrip()
                    if e.kind == EventKind.FENCED
                    else ""
                ),
                "at": e.at,
                "left": at(e.at),
                "seconds": round((e.at - start).total_seconds(), 3),
            }
            for e in events
            if e.attempt_id == a.attempt_id and e.kind in LANE_MARKS
        ]
        lanes.append(
            {
                "attempt": a,
                "status": status,
                "left": at(a.started_at),
                "width": max(0.5, round(at(min(finished, end)) - at(a.started_at), 2)),
                "held_seconds": round((min(finished, end) - a.started_at).total_seconds(), 3),
                "marks": marks,
            }
        )
    return {"start": start, "end": end, "span_seconds": round(span, 3), "lanes": lanes}


# --- the metric tallies: /metrics and the console's Metrics page ---------------------------------------------


@contextmanager
def one_snapshot() -> Iterator[None]:
    """Every read inside sees the database as of one moment on PostgreSQL: a read-only REPEATABLE READ transaction
    (a write inside fails). A page built from many queries then never shows a stage from before a change beside a
    record from after it. Inside a caller's transaction, that transaction's is the one. On SQLite (the embedded
    default) nothing is opened: its every transaction is BEGIN IMMEDIATE, the write lock, and a page polled every
    3 s must not hold writers up while it renders; there each read sees the last commit."""
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield


@contextmanager
def metrics_snapshot() -> Iterator[tuple[datetime | None, datetime | None]]:
    """One read-only snapshot (REPEATABLE READ on PostgreSQL) in which the tallies and the watermark agree: yields
    the watermark (``through``) and when the last fold ran."""
    fresh = not connection.in_atomic_block  # inside a caller's transaction, its snapshot is the one we get
    with transaction.atomic():  # on SQLite too: the fold and the tallies must agree (a short read)
        if fresh and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        fold = MetricFold.objects.filter(name="claims").values_list("through", "folded_at").first()
        through, folded_at = fold if fold else (None, None)
        interleave.reach("metrics.watermark_read")  # a fold committing here is what the snapshot is for
        yield through, folded_at


def read_minutes(*, now: datetime, minutes: int = 60) -> tuple[list[datetime], defaultdict[MinuteKey, float]]:
    """The console's Metrics page figures per namespace and minute over the last ``minutes`` minutes up to ``now``
    (the caller's clock: nothing stamped after it is counted) — the folded minutes plus the unfolded stretch, from
    one snapshot. Its cost is the window's tally rows and the stretch since the fold, not the hour's events."""
    last = tallies.minute_of(now)
    window = [last - timedelta(minutes=minutes - 1 - i) for i in range(minutes)]
    with metrics_snapshot() as (through, _):
        out: defaultdict[MinuteKey, float] = defaultdict(float)
        rows = MinuteTally.objects.filter(minute__gte=window[0], minute__lte=last)
        for namespace_id, minute, series, value in rows.values_list(
            "namespace_id", "minute", "series", "value"
        ):
            out[(namespace_id, minute, series)] += value
        since = window[0] if through is None else max(through, window[0])
        if since < now:
            for key, value in tallies.per_minute(since=since, until=now).items():
                out[key] += value
    return window, out


# --- the jobs: their schedule, their recorded runs --------------------------------------------------------------


def job_intervals() -> dict[str, float]:
    """Each periodic job's interval in seconds, from beat's schedule (the settings)."""
    from django.conf import settings

    out: dict[str, float] = {}
    entries: dict[str, dict[str, Any]] = settings.CELERY_BEAT_SCHEDULE
    for entry in entries.values():
        schedule = entry["schedule"]
        seconds = schedule if isinstance(schedule, int | float) else schedule.run_every.total_seconds()
        out[str(entry["task"])] = float(seconds)
    return out


def known_jobs() -> set[str]:
    """Every job the installed apps define (Celery's registry of shared tasks), its own internal ones left out."""
    from celery import current_app

    current_app.loader.import_default_modules()  # every app's tasks module (autodiscovery is lazy); once
    return {name for name in current_app.tasks if not name.startswith("celery.")}


def jobs_overview(now: datetime, *, runs: int = 10) -> list[dict[str, Any]]:
    """Every job that is scheduled or has run: its interval (periodic ones), when it last succeeded and how long
    ago, whether it is behind (no success within two intervals), its outcomes over the last hour, and its last
    ``runs`` runs with their durations and errors — what the Jobs page shows and /metrics' job families expose."""
    intervals = job_intervals()
    hour_ago = now - timedelta(hours=1)
    out = []
    for job in sorted(set(intervals) | known_jobs()):
        # Each read one range of the (job, -finished_at) index: the scrape costs the last hour's runs and one row
        # per job, not the whole retention (JOB_RUNS_KEEP_HOURS of runs).
        runs_of = JobRun.objects.filter(job=job)
        last_success = (
            runs_of.filter(outcome="SUCCESS")
            .order_by("-finished_at")
            .values_list("finished_at", flat=True)
            .first()
        )
        hour = dict(
            runs_of.filter(finished_at__gte=hour_ago)
            .order_by()
            .values_list("outcome")
            .annotate(n=Count("id"))
        )
        age = (now - last_success).total_seconds() if last_success else None
        interval = intervals.get(job)
        out.append(
            {
                "job": job,
                "interval": interval,
                "last_success": last_success,
                "age": age,
                "behind": interval is not None and (age is None or age > 2 * interval),
                "hour": {outcome: hour.get(outcome, 0) for outcome in ("SUCCESS", "FAILURE", "RETRY")},
                "runs": [
                    {**run, "seconds": round((run["finished_at"] - run["started_at"]).total_seconds(), 3)}
                    for run in runs_of.order_by("-finished_at").values(
                        "started_at", "finished_at", "outcome", "error"
                    )[:runs]
                ]
                if runs
                else [],
            }
        )
    return out


def effects_sent(effect_ids: Sequence[str]) -> dict[str, bool]:
    """Per dispatched effect: True when a dispatch began that may have reached its target (an intent is recorded
    SENDING before the first byte leaves), False when every dispatch is known not to have left (no connection).
    Effects never dispatched here are absent."""
    sent: dict[str, bool] = {}
    for effect_id, state, not_sent in DispatchIntent.objects.filter(
        effect_id__in=list(effect_ids)
    ).values_list("effect_id", "state", "not_sent"):
        began = state in (DispatchState.SENDING, DispatchState.DELIVERED) and not not_sent
        sent[effect_id] = sent.get(effect_id, False) or began
    return sent


def attempt_fenced(task: Task) -> bool:
    """Whether the task's current attempt was ended by an epoch fence: granted under an older epoch than the
    namespace's now, or marked so — what its header says instead of "lease expired"."""
    if task.attempt_id is None:
        return False
    if task.scheduler_epoch < task.namespace.scheduler_epoch:
        return True
    return Attempt.objects.filter(pk=task.attempt_id, end_reason=AttemptEnd.FENCED).exists()
