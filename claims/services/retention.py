"""Retention (issue 13 item 8): the timeline, discarded attempts and the audit log are deleted once they are older
than the retention window and nothing still needs them — in small batches, each its own short transaction, by the
``prune_history`` beat job. docs/operations.md ("Retention") is the operator's account.

What is kept, whatever its age:

- everything of a task that is not finished (READY, BLOCKED, CLAIMED), or finished within the window (its
  ``updated_at``): a task's timeline goes whole or not at all;
- everything of a task with an effect not in a final state (PREPARED, UNKNOWN, …): the reconcile needs its history;
- everything of a task another app asks to keep (``keep_tasks``: the rollout keeps tasks with a mismatch under
  review);
- what /metrics has not folded yet (``MetricFold.through``): counters never go backwards;
- the canonical staged result (with the task row, the record of who committed what: a repeat of the commit answers
  from the two);
- namespace events (fences, resumes) and audit entries newer than their own windows.

The window must exceed the rollout's (``ROLLOUT_WINDOW_SECONDS``), so a gate or coverage figure never loses a record
it counts; settings refuse a shorter one. The tasks table itself is not pruned: one row per task is the product's
record of the work (the contract lets a client read any task it created).

The timeline and the audit log are append-only in the database (migration 0004): a DELETE is refused unless the
transaction has set ``claims.retention`` (``SET LOCAL``, so it ends with the batch), which only this module does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet

from .. import clock, interleave
from ..models import (
    Attempt,
    AuditEntry,
    ClaimKey,
    Effect,
    EffectState,
    MetricFold,
    StagedResult,
    Task,
    TaskEvent,
    TaskState,
)

FINAL_EFFECT_STATES = [EffectState.COMMITTED, EffectState.FAILED]
FINISHED = [TaskState.COMMITTED, TaskState.CANCELLED]

# Other apps register what they need kept: each returns a queryset of task ids (values_list("task_id")).
_keepers: list[Callable[[], QuerySet]] = []


def keep_tasks(keeper: Callable[[], QuerySet]) -> Callable[[], QuerySet]:
    """Register ``keeper``: the task ids it returns are never pruned (the core knows nothing of who asks)."""
    _keepers.append(keeper)
    return keeper


@dataclass
class Pruned:
    events: int = 0
    attempts: int = 0
    staged_results: int = 0
    audit_entries: int = 0
    claim_keys: int = 0
    batches: int = 0
    more: bool = False  # stopped at the time budget with rows left


def _allow_delete() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL claims.retention = 'on'")


def _prunable_tasks(cutoff: datetime) -> QuerySet[Task]:
    """Finished before the cutoff, with every effect final, and asked to be kept by nobody."""
    open_effects = Effect.objects.filter(task_id=OuterRef("pk")).exclude(state__in=FINAL_EFFECT_STATES)
    tasks = Task.objects.filter(state__in=FINISHED, updated_at__lt=cutoff).exclude(Exists(open_effects))
    for keeper in _keepers:
        tasks = tasks.exclude(pk__in=keeper())
    return tasks


def delete_batch(rows: QuerySet, size: int) -> int:
    """Delete up to ``size`` of ``rows`` (oldest first by its ordering), in one short transaction — for records no
    service locks or revives (audit entries, the rollout's per-operation records)."""
    with transaction.atomic(durable=True):
        _allow_delete()
        ids = list(rows.values_list("pk", flat=True)[:size])
        if not ids:
            return 0
        deleted, _ = rows.model._default_manager.filter(pk__in=ids).delete()
        return deleted


def _hold_finished(task_ids: set[str], cutoff: datetime) -> set[str]:
    """Of ``task_ids``, those still finished before the cutoff — read under FOR SHARE on their rows, held until the
    batch commits. A requeue or an input revision (FOR NO KEY UPDATE on the task row) that committed after the
    batch chose its rows is seen here and the task is left alone; one that comes later waits for the batch. The
    prune takes no other row lock, and never upgrades this one."""
    if not task_ids:
        return set()
    locked = Task.objects.filter(pk__in=task_ids, state__in=FINISHED, updated_at__lt=cutoff)
    if connection.vendor != "postgresql":  # SQLite: the batch's transaction is the only writer
        return set(locked.values_list("pk", flat=True))
    sql, params = locked.values_list("pk", flat=True).query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"{sql} FOR SHARE", params)
        return {row[0] for row in cursor.fetchall()}


def _task_batch(rows: QuerySet, size: int, cutoff: datetime) -> tuple[int, int]:
    """Delete up to ``size`` of ``rows`` — records of tasks — whose task is still finished once its row is held
    (``_hold_finished``); records with no task (namespace events) go as chosen."""
    with transaction.atomic(durable=True):
        _allow_delete()
        chosen = list(rows.values_list("pk", "task_id")[:size])
        if not chosen:
            return 0, 0
        interleave.reach("history_prune.chosen")
        held = _hold_finished({task for _, task in chosen if task is not None}, cutoff)
        ids = [pk for pk, task in chosen if task is None or task in held]
        deleted = rows.model._default_manager.filter(pk__in=ids).delete()[0] if ids else 0
        # A record left here belongs to a task that came back to life since ``rows`` was read; the next read of
        # ``rows`` no longer offers it, so the loop moves on.
        return len(chosen), deleted


def _prune_claim_keys(result: Pruned, now: datetime, size: int, deadline: float) -> None:
    """Claim keys older than CLAIM_KEY_RETENTION_SECONDS (a repeat of a claim that old is a new request)."""
    old = ClaimKey.objects.filter(
        created_at__lt=now - timedelta(seconds=settings.CLAIM_KEY_RETENTION_SECONDS)
    ).order_by("created_at")
    while time.monotonic() <= deadline:
        deleted = delete_batch(old, size)
        result.batches += 1
        result.claim_keys += deleted
        if deleted < size:
            return


def history_prune(*, budget_seconds: float = 30.0, batch: int | None = None) -> Pruned:
    """Delete what retention allows, batch by batch, until nothing is left or ``budget_seconds`` have passed.

    1. Read the clock and the metric fold's watermark; the cutoff is now − RETENTION_SECONDS, and no record at or
       after the watermark is touched.
    2. Timeline events of prunable tasks, and namespace events, stamped before both.
    3. Staged results of prunable tasks that never became canonical, then every attempt of them ended before both.
       The canonical staged result stays: with the task row it is the record of what was committed, and a repeat of
       the commit answers from it (its attempt is read off the task row, never from the attempts table).
    4. Audit entries older than AUDIT_RETENTION_SECONDS.

    First, whatever RETENTION_SECONDS says: claim keys older than CLAIM_KEY_RETENTION_SECONDS (``claim_keys``; a
    repeat of a claim that old is answered as a new request).

    Each batch re-reads its conditions in its own transaction, so a task that came back to life (requeued, its input
    revised) between batches is not touched.
    """
    size = batch or settings.RETENTION_BATCH
    result = Pruned()
    deadline = time.monotonic() + budget_seconds
    now = clock.now()
    _prune_claim_keys(result, now, size, deadline)
    if not settings.RETENTION_SECONDS:
        return result
    cutoff = now - timedelta(seconds=settings.RETENTION_SECONDS)
    folded = MetricFold.objects.filter(name="claims").values_list("through", flat=True).first()
    counted = min(cutoff, folded) if folded else None
    if counted is None:
        return result  # nothing folded yet: every record still feeds /metrics

    def events() -> QuerySet:
        prunable = _prunable_tasks(cutoff)
        return (
            TaskEvent.objects.filter(at__lt=counted)
            .filter(Q(task_id__isnull=True) | Q(task_id__in=prunable.values("pk")))
            .order_by("at")
        )

    def attempts() -> QuerySet:
        return Attempt.objects.filter(
            ended_at__lt=counted, task_id__in=_prunable_tasks(cutoff).values("pk")
        ).order_by("ended_at")

    def staged() -> QuerySet:
        return StagedResult.objects.filter(
            canonical=False, staged_at__lt=cutoff, task_id__in=_prunable_tasks(cutoff).values("pk")
        ).order_by("staged_at")

    audit_cutoff = now - timedelta(seconds=settings.AUDIT_RETENTION_SECONDS)
    of_tasks: list[tuple[str, Callable[[], QuerySet]]] = [
        ("events", events),
        ("staged_results", staged),
        ("attempts", attempts),
    ]
    for name, rows in of_tasks:
        while True:
            if time.monotonic() > deadline:
                result.more = True
                return result
            looked, deleted = _task_batch(rows(), size, cutoff)
            result.batches += 1
            setattr(result, name, getattr(result, name) + deleted)
            if looked < size:
                break
    audit = AuditEntry.objects.filter(at__lt=audit_cutoff).order_by("at")
    while True:
        if time.monotonic() > deadline:
            result.more = True
            return result
        deleted = delete_batch(audit, size)
        result.batches += 1
        result.audit_entries += deleted
        if deleted < size:
            break
    return result
