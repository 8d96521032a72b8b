"""Rollout reads: each namespace's stage, the window, validation coverage, compared operations, mismatches, drain
counts, workers, and the task reads by stage. The gates, the API, the metrics and the console share these, so a
figure means the same everywhere. Nothing here writes."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Case, CharField, Count, F, OuterRef, Q, QuerySet, Subquery, Value, When

from claims import clock
from claims import selectors as core_selectors
from claims.errors import NotFound
from claims.models import (
    AcceptancePoint,
    Namespace,
    Task,
    TaskEvent,
    TaskState,
)
from oncall.selectors import drain_counts

from .legacy import legacy_store
from .models import (
    DEFAULT_PROTOCOL,
    DEFAULT_STAGE,
    ComparedOperation,
    CoverageWaiver,
    DrainSnapshot,
    GateEvaluation,
    LegacyClaim,
    LegacyImport,
    LegacyWrite,
    Mismatch,
    MismatchReason,
    MismatchStatus,
    ObserverPosition,
    Rollback,
    RolloutState,
    Stage,
    StageChange,
    WorkerRegistration,
    WriteBackDifference,
)

POINTS = [point.value for point in AcceptancePoint]
LEGACY_READS = (Stage.LEGACY, Stage.SHADOW)


def namespace_or_404(name: str) -> Namespace:
    """The namespace with its rollout record (one query), or NotFound."""
    namespace = Namespace.objects.select_related("rollout").filter(name=name).first()
    if namespace is None:
        raise NotFound(f"no such namespace: {name}")
    return namespace


def rollout_state(namespace: Namespace) -> tuple[str, str]:
    """(stage, min_protocol). Load the namespace with ``select_related("rollout")`` to read it without a query.
    A namespace the core created alone has no record: V1_ONLY, legacy."""
    try:
        state = namespace.rollout
    except RolloutState.DoesNotExist:
        return DEFAULT_STAGE, DEFAULT_PROTOCOL
    return state.stage, state.min_protocol


def stage_of(namespace: Namespace) -> str:
    return rollout_state(namespace)[0]


def stage_of_name(namespace: str) -> str:
    """A namespace's stage by its name (an unknown namespace: the core's default, V1_ONLY)."""
    stage = RolloutState.objects.filter(namespace__name=namespace).values_list("stage", flat=True).first()
    return stage or DEFAULT_STAGE


def stage_at(namespace: str, at: datetime) -> str:
    """The stage a namespace had at ``at`` (its stage changes are recorded with their time): what observe mode judges
    a legacy change by — the stage when legacy committed it, not when the observer read it."""
    change = StageChange.objects.filter(namespace=namespace, at__lte=at).order_by("-at", "-id").first()
    if change is not None:
        return change.to_stage
    first = StageChange.objects.filter(namespace=namespace).order_by("at", "id").first()
    return first.from_stage if first is not None else stage_of_name(namespace)


def shadow_began(namespace: str, at: datetime) -> datetime | None:
    """When the namespace last entered SHADOW from LEGACY, at or before ``at``."""
    change = (
        StageChange.objects.filter(
            namespace=namespace, from_stage=Stage.LEGACY, to_stage=Stage.SHADOW, at__lte=at
        )
        .order_by("-at", "-id")
        .first()
    )
    return change.at if change is not None else None


ORDER: list[str] = [Stage.LEGACY, Stage.SHADOW, Stage.V1_READS, Stage.V1_WRITES, Stage.V1_ONLY]


def next_stage(stage: str) -> str | None:
    index = ORDER.index(stage)
    return ORDER[index + 1] if index + 1 < len(ORDER) else None


def last_gate(namespace: Namespace, stage: str | None = None) -> GateEvaluation | None:
    """The newest recorded evaluation of the gate out of the namespace's stage, since the stage began — recorded
    by the ``gate_check`` beat job and by every advance; None before the first (or at V1_ONLY)."""
    stage = stage or stage_of(namespace)
    to = next_stage(stage)
    if to is None:
        return None
    return (
        GateEvaluation.objects.filter(
            namespace=namespace.name, move=f"{stage} → {to}", at__gte=stage_started_at(namespace)
        )
        .order_by("-at", "-id")
        .first()
    )


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


def validation_counts(
    *, namespace: Namespace | None = None, since: datetime | None = None, until: datetime | None = None
) -> dict[str, dict[str, int]]:
    """Per acceptance point: requests that reached it (``total``) and those claim.v1 checked with epoch and
    generation of their own (``validated``: not passed on from the legacy API). Every point is present."""
    # ``point IN (…)`` rather than ``IS NOT NULL``: one index range per point on (namespace, point, at), each bounded
    # by the window — with ``IS NOT NULL`` the time bound could not narrow the scan of the namespace's history.
    events = TaskEvent.objects.filter(point__in=POINTS)
    if namespace is not None:
        events = events.filter(namespace_id=namespace.id)
    if since is not None:
        events = events.filter(at__gte=since)
    if until is not None:
        events = events.filter(at__lte=until)
    rows = events.values("point").annotate(total=Count("id"), validated=Count("id", filter=Q(via="")))
    counts = {row["point"]: row for row in rows}
    return {
        point: {
            "validated": counts.get(point, {}).get("validated", 0),
            "total": counts.get(point, {}).get("total", 0),
        }
        for point in POINTS
    }


def coverage(namespace: Namespace, now: datetime | None = None) -> dict[str, Any]:
    """Per acceptance point over the window: ``validation_counts``, the ratio, and whether it is waived. A point
    with no traffic is covered only when waived."""
    now = now or clock.now()
    start = window_start(namespace, now)
    counts = validation_counts(namespace=namespace, since=start, until=now)
    waived = set(
        CoverageWaiver.objects.filter(
            namespace=namespace.name, at__gte=stage_started_at(namespace)
        ).values_list("point", flat=True)
    )
    points = {}
    for point in POINTS:
        total, validated = counts[point]["total"], counts[point]["validated"]
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


def worker_is_stale(registration: WorkerRegistration, now: datetime) -> bool:
    """No heartbeat within WORKER_STALE_SECONDS: the one staleness the gate, the API and the console use."""
    return registration.last_heartbeat < now - timedelta(seconds=settings.WORKER_STALE_SECONDS)


def fresh_v1_workers(namespace: Namespace, now: datetime | None = None) -> int:
    now = now or clock.now()
    return WorkerRegistration.objects.filter(
        namespace=namespace.name,
        protocol="claim.v1",
        refused=False,
        last_heartbeat__gte=now - timedelta(seconds=settings.WORKER_STALE_SECONDS),
    ).count()


# --- task reads by stage: in LEGACY and SHADOW the legacy store is authoritative for who holds a task and what
# its result is, so the task read and the frontier show the legacy view; from V1_READS on, claim.v1's. ---


def with_legacy_state(tasks: QuerySet[Task]) -> QuerySet[Any]:
    """Annotate ``read_state``: the state a reader sees where the legacy store is authoritative (claim.v1's column
    elsewhere), and ``legacy_owner``. The legacy row is read by scalar subqueries on its primary key, evaluated only
    for rows of legacy-read namespaces (CASE stops at the first branch that holds): an EXISTS here was planned as a
    hash of every completed legacy row — a cost that grew with the legacy store's history on every list."""
    now = clock.now()
    if getattr(legacy_store(), "separate_database", False):
        # Their table is in another database: no subquery reaches it. A list filters on claim.v1's column (which
        # mirrors legacy's decisions in shadow); each item read (``legacy_view``) answers from their table.
        return tasks.annotate(
            legacy_completed_by=Value(""),
            legacy_owner=Value(None, output_field=CharField()),
            read_state=F("state"),
        )
    row = LegacyClaim.objects.filter(pk=OuterRef("pk"))
    legacy_reads = Q(namespace__rollout__stage__in=LEGACY_READS)
    return tasks.annotate(
        legacy_completed_by=Subquery(row.values("completed_by")[:1]),
        legacy_owner=Subquery(
            row.filter(completed_by="", expires_at__gt=now).exclude(owner_id="").values("owner_id")[:1]
        ),
    ).annotate(
        read_state=Case(
            When(~legacy_reads, then="state"),
            When(state__in=[TaskState.BLOCKED, TaskState.CANCELLED], then="state"),
            When(legacy_completed_by__gt="", then=Value(TaskState.COMMITTED)),
            When(legacy_owner__isnull=False, then=Value(TaskState.CLAIMED)),
            default=Value(TaskState.READY),
            output_field=CharField(),
        ),
    )


def task_list(*, namespace: str | None = None, state: str | None = None) -> QuerySet[Any]:
    """The task list as readers see it by stage, oldest first, at a cost flat in the history (issue 13).

    The state a reader sees is ``with_legacy_state``'s ``read_state``: claim.v1's column from V1_READS on (and in
    every namespace the rollout never staged), the legacy store's view in LEGACY and SHADOW. Filtering on it row by
    row walks the whole history to find a sparse state, so the sparse states first take a small candidate set —
    one semi-join on indexed sets — and ``read_state`` then decides exactly:

    - READY: tasks READY in claim.v1; tasks CLAIMED in claim.v1 in a legacy-read namespace (legacy may have let the
      claim lapse); tasks whose legacy row is not completed (partial index ``legacy_incomplete``). A task claim.v1
      committed in V1_ONLY that legacy never heard of (no row), read after a rollback to LEGACY or SHADOW, is not
      offered: it was committed (docs/rollout.md).
    - CLAIMED: tasks CLAIMED in claim.v1, and tasks whose legacy row is not completed.
    - BLOCKED, CANCELLED: the column (the legacy view shows claim.v1's for these in every stage).
    - COMMITTED: no narrowing — dense among old tasks, so the ordered scan stops after a page.

    A namespace named in the query and read from claim.v1 filters on the column alone.
    """
    named: Namespace | None = None
    base = core_selectors.task_list().select_related("namespace__rollout")
    if namespace is not None:
        # by its id, not a join on its name: the (namespace, …) indexes are then read in order
        named = Namespace.objects.select_related("rollout").filter(name=namespace).first()
        base = base.filter(namespace_id=named.pk) if named is not None else base.none()
    tasks = with_legacy_state(base)
    if not state:
        return tasks
    if state in (TaskState.BLOCKED, TaskState.CANCELLED):
        return tasks.filter(state=state)
    if named is not None and stage_of(named) not in LEGACY_READS:
        return tasks.filter(state=state)  # claim.v1's column: (namespace, state, created_at) in order
    if named is not None and state == TaskState.COMMITTED:
        return tasks.filter(read_state=state)  # a legacy-read namespace: dense, the ordered scan stops early
    incomplete = LegacyClaim.objects.filter(completed_by="").values("task_id")
    if state == TaskState.READY:
        candidates = (
            Task.objects.filter(state=TaskState.READY)
            .values("task_id")
            .union(
                Task.objects.filter(
                    state=TaskState.CLAIMED, namespace__rollout__stage__in=LEGACY_READS
                ).values("task_id"),
                incomplete,
                all=True,
            )
        )
        tasks = tasks.filter(pk__in=candidates)
    elif state == TaskState.CLAIMED:
        candidates = (
            Task.objects.filter(state=TaskState.CLAIMED).values("task_id").union(incomplete, all=True)
        )
        tasks = tasks.filter(pk__in=candidates)
    else:
        # COMMITTED: the column where claim.v1 is read; every task of a legacy-read namespace is a candidate.
        legacy_ids = RolloutState.objects.filter(stage__in=LEGACY_READS).values("namespace_id")
        tasks = tasks.filter(Q(state=state) | Q(namespace_id__in=legacy_ids))
    return tasks.filter(read_state=state)


def task_get(*, task_id: str) -> Task:
    """The task with its namespace and the namespace's rollout record, one query."""
    task = Task.objects.select_related("namespace__rollout").filter(pk=task_id).first()
    if task is None:
        raise NotFound("no such task")
    return task


def legacy_view(task: Task) -> Task:
    """The task as a reader sees it: in LEGACY/SHADOW an unsaved copy carrying legacy's holder, expiry and result
    (and ``read_from = "legacy"``); from V1_READS on, the task itself."""
    if stage_of(task.namespace) not in LEGACY_READS:
        return task
    view = copy.copy(task)
    setattr(view, "read_from", "legacy")  # noqa: B010 - an attribute the read adds, not a field
    if task.state in (TaskState.BLOCKED, TaskState.CANCELLED):
        return view
    row = legacy_store().get(
        task_id=task.task_id
    )  # the team's own table through its adapter, where configured
    if row is not None and row.completed_by:
        view.state, view.owner_id, view.lease_expires_at = TaskState.COMMITTED, row.completed_by, None
        view.result, view.result_digest = row.result, row.result_digest or None
    elif row is not None and row.owner_id and row.expires_at and row.expires_at > clock.now():
        view.state, view.owner_id, view.lease_expires_at = TaskState.CLAIMED, row.owner_id, row.expires_at
        view.result = view.result_digest = None
    else:
        view.state, view.owner_id, view.lease_expires_at = TaskState.READY, None, None
        view.result = view.result_digest = None
    return view


# --- lists the rollout API and console show ---------------------------------------------------------------------


def mismatches(
    namespace: str, *, reason: str | None = None, status: str | None = None, since: datetime | None = None
) -> QuerySet[Mismatch]:
    rows = Mismatch.objects.filter(namespace=namespace).order_by("-at", "-id")
    if reason:
        rows = rows.filter(reason=reason)
    if status:
        rows = rows.filter(status=status)
    if since:
        rows = rows.filter(at__gte=since)
    return rows


def open_rollback(namespace: str) -> Rollback | None:
    return Rollback.objects.filter(namespace=namespace, finished_at__isnull=True).first()


def legacy_writes_pending(namespace: str | None = None) -> int:
    """claim.v1 decisions recorded for a legacy table in another database and not applied there yet."""
    pending = LegacyWrite.objects.filter(applied_at__isnull=True)
    return (pending.filter(namespace=namespace) if namespace is not None else pending).count()


def direct_writes_open(namespace: str) -> int:
    """Observe mode: old binaries' direct writes to the legacy table not yet reviewed (open DIRECT_WRITE)."""
    return Mismatch.objects.filter(
        namespace=namespace, reason=MismatchReason.DIRECT_WRITE, status=MismatchStatus.OPEN
    ).count()


def direct_writes_by_namespace() -> dict[str, int]:
    rows = (
        Mismatch.objects.filter(reason=MismatchReason.DIRECT_WRITE, status=MismatchStatus.OPEN)
        .values("namespace")
        .annotate(n=Count("id"))
    )
    return {row["namespace"]: row["n"] for row in rows}


def legacy_writes_pending_by_namespace() -> dict[str, int]:
    rows = LegacyWrite.objects.filter(applied_at__isnull=True).values("namespace").annotate(n=Count("id"))
    return {row["namespace"]: row["n"] for row in rows}


def observer_positions() -> list[ObserverPosition]:
    return list(ObserverPosition.objects.order_by("name"))


def observers_shown() -> list[dict[str, Any]]:
    """Each observer of a legacy table with how far behind legacy its last pass ended, beside legacy's lease."""
    rows = []
    for position in observer_positions():
        behind, lease = position.behind_seconds, position.lease_seconds
        rows.append(
            {
                "position": position,
                "method": "binary log"
                if position.name.startswith("binlog:")
                else ("polling" if position.name.startswith("poll:") else "change stream (pgoutput)"),
                "behind": behind,
                "lease": lease,
                "beyond_a_lease": behind is not None and lease is not None and behind > lease,
            }
        )
    return rows


def legacy_import_of(namespace: str) -> LegacyImport | None:
    """The namespace's newest import of a legacy table's rows (entering SHADOW), with its progress."""
    return LegacyImport.objects.filter(namespace=namespace).order_by("-id").first()


def write_back_differences(namespace: str, rollback_id: Any, limit: int = 200) -> list[WriteBackDifference]:
    """What a rollback's write-back overwrote in the legacy table: completions claim.v1 did not share."""
    rows = list(
        WriteBackDifference.objects.filter(namespace=namespace, rollback_id=rollback_id).order_by("task_id")[
            :limit
        ]
    )
    for row in rows:  # the results as JSON, as the API would show them
        row.table_result = json.dumps(row.table.get("result"), sort_keys=True)  # type: ignore[attr-defined]
        row.v1_result = json.dumps(row.claim_v1.get("result"), sort_keys=True)  # type: ignore[attr-defined]
    return rows


def last_snapshot(namespace: str, pool: str = "") -> DrainSnapshot | None:
    return DrainSnapshot.objects.filter(namespace=namespace, pool=pool).order_by("-taken_at", "-id").first()


def drain_now(namespace: Namespace, pool: str = "") -> dict[str, Any]:
    """The last drain snapshot, or — before any was taken — the counts as they stand, recorded by nobody."""
    snapshot = last_snapshot(namespace.name, pool)
    if snapshot is not None:
        return {
            "pool": snapshot.pool or None,
            "active_leases": snapshot.active_leases,
            "unknown_effects": snapshot.unknown_effects,
            "awaiting_commit": snapshot.awaiting_commit,
            "legacy_writes_pending": snapshot.legacy_writes_pending,
            "direct_writes": snapshot.direct_writes,
            "clean": snapshot.is_clean,
            "clean_streak": snapshot.clean_streak,
            "taken_at": snapshot.taken_at,
        }
    counts = {
        **drain_counts(namespace, pool=pool or None),
        "legacy_writes_pending": legacy_writes_pending(namespace.name),
        "direct_writes": direct_writes_open(namespace.name),
    }
    return {
        "pool": pool or None,
        **counts,
        "clean": not any(counts.values()),
        "clean_streak": 0,
        "taken_at": None,
    }


def pools() -> list[dict[str, Any]]:
    by_pool: dict[str, list[WorkerRegistration]] = {}
    for reg in WorkerRegistration.objects.order_by("pool", "principal"):
        by_pool.setdefault(reg.pool or "", []).append(reg)
    return [{"pool": pool, "workers": regs} for pool, regs in by_pool.items()]


def snapshot_is_stale(snapshot: DrainSnapshot | None, now: datetime) -> bool:
    """Older than two drain intervals: the drain_check job has not run lately, the figures may be out of date."""
    return snapshot is not None and snapshot.taken_at < now - timedelta(
        seconds=2 * settings.DRAIN_INTERVAL_SECONDS
    )
