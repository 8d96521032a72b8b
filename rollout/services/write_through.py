"""V1_WRITES' write-through to a legacy table in another database: nothing dropped between the two databases.

claim.v1 decides in our database; the team's legacy table lives in theirs, and no transaction spans both. So the
order is fixed (docs/adopting.md, "Two databases"):

1. the decision and its ``LegacyWrite`` rows commit together, in our database (``record``, inside the decision's
   transaction) — a decision is never without its write-through, whatever dies next;
2. the rows are applied to the legacy table in that database's own transaction — right after the commit by the
   request itself (``record`` arranges it), and by the ``apply_legacy_writes`` job for whatever that left: a
   process killed between the two commits, the legacy database down or a row lock there that would not come;
3. the rows are marked applied, in ours.

A kill between 2 and 3 applies the rows again: harmless, since a write-through sets the row's owner and expiry to
claim.v1's, or completes it with claim.v1's canonical result — applying one twice leaves the row as applying it
once did. Order is what matters: rows are applied in id order by an applier holding them FOR UPDATE (id order,
then the legacy rows — the store's transaction), so two appliers wait for each other rather than overtake, and
two writes of one task land in the order they were decided (the second decision's row was inserted after the
first's committed: the task row's lock orders them). The backlog is a metric
(``controlplane_legacy_writes_pending``) and part of the drain that gates V1_ONLY and a rollback.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import F

from claims import clock, interleave
from claims.models import Namespace, Task, TaskState

from ..legacy import LegacyAsk, LegacyVerdict, decide, legacy_store, outside_unit
from ..models import LegacyClaim, LegacyWrite, WriteBackDifference

log = logging.getLogger(__name__)

_BATCH = 500  # rows an applier takes at once


@dataclass
class Applied:
    applied: int = 0
    missing: int = 0  # rows the legacy table does not have (nothing to write there)
    failed: int = 0
    errors: list[str] = field(default_factory=list)


def record(asks: list[LegacyAsk], *, namespace: str, at: datetime, apply_after_commit: bool = True) -> None:
    """Inside the decision's transaction: its write-through, as rows of ours (one statement); applied once that
    transaction has committed."""
    if not asks:  # a claim-next that found nothing, a batch all refused: nothing to write through
        return
    rows = LegacyWrite.objects.bulk_create(
        [
            LegacyWrite(
                namespace=namespace,
                task_id=ask.fields["task_id"],
                kind=ask.kind,
                fields=_recorded(ask.fields),
                created_at=at,
            )
            for ask in asks
        ]
    )
    if apply_after_commit:
        last = max(row.pk for row in rows)
        tasks = sorted({row.task_id for row in rows})
        transaction.on_commit(partial(_apply_after_commit, tasks, last), robust=True)


def _apply_after_commit(task_ids: list[str], up_to: int) -> None:
    interleave.reach("write_through.committed")
    outcome = apply_pending(task_ids=task_ids, up_to=up_to)
    if outcome.failed:
        log.warning("write-through left for the job: %s", "; ".join(outcome.errors))


def apply_pending(
    *, task_ids: list[str] | None = None, up_to: int | None = None, namespace: str | None = None
) -> Applied:
    """Apply what is pending (of these tasks, up to this row, of this namespace), oldest first, in batches until
    nothing is left or a try fails; the job calls it with no filter. Each batch: the rows FOR UPDATE in id order in
    our database, the legacy store's transactions (each a wave in which no task appears twice), then the rows marked
    in ours. When a wave fails, the oldest row left counts a try and keeps the error; it and everything after it
    wait for the next run (order before progress)."""
    total = Applied()
    while True:
        done = _apply_batch(task_ids=task_ids, up_to=up_to, namespace=namespace)
        total.applied += done.applied
        total.missing += done.missing
        total.failed += done.failed
        total.errors += done.errors
        if done.failed or done.applied + done.missing < _BATCH:
            return total


def _apply_batch(*, task_ids: list[str] | None, up_to: int | None, namespace: str | None) -> Applied:
    out = Applied()
    with outside_unit(), transaction.atomic(durable=True):
        pending = LegacyWrite.objects.select_for_update().filter(applied_at__isnull=True)
        if task_ids is not None:
            pending = pending.filter(task_id__in=task_ids)
        if up_to is not None:
            pending = pending.filter(id__lte=up_to)
        if namespace is not None:
            pending = pending.filter(namespace=namespace)
        rows = list(pending.order_by("id")[:_BATCH])
        if not rows:
            return out
        store = legacy_store()
        outcomes: list[tuple[LegacyWrite, LegacyVerdict]] = []
        failed: list[LegacyWrite] = []
        for wave in _waves(rows):
            try:
                verdicts = decide(store, [LegacyAsk(row.kind, _fields(row)) for row in wave])
            except DatabaseError as exc:
                failed = rows[rows.index(wave[0]) :]
                out.errors.append(f"{type(exc).__name__}: {exc}".strip()[:2000])
                break
            outcomes += zip(wave, verdicts, strict=True)
        interleave.reach("write_through.applied")
        now = clock.now()
        for row, verdict in outcomes:
            row.applied_at, row.outcome = now, verdict.word
        if outcomes:
            LegacyWrite.objects.bulk_update([row for row, _ in outcomes], ["applied_at", "outcome"])
        if failed:
            LegacyWrite.objects.filter(pk=failed[0].pk).update(tries=F("tries") + 1, error=out.errors[-1])
    out.missing = sum(verdict.word == "MISSING" for _, verdict in outcomes)
    out.applied = len(outcomes) - out.missing
    out.failed = len(failed)
    return out


def write_back(*, namespace: str, rollback_id: Any = None) -> int:
    """Before a rollback hands the namespace back to legacy (its stage still claim.v1's, claims fenced and paused,
    so claim.v1's records hold still): the legacy table made to match claim.v1 in every mapped column — what V1_ONLY
    never wrote there, what V1_WRITES could not, and what old binaries wrote directly. Pending write-throughs first,
    in order; then every task: committed → the row completed with claim.v1's canonical result; otherwise its owner
    and expiry as claim.v1 has them (a live, unfenced attempt's, else none) and no completion. claim.v1 wins — it
    decided in those stages — but a row whose completion disagreed is recorded first (``WriteBackDifference``,
    listed on the console), never silently erased. Batches of the store's own transactions (committed at once:
    ours has nothing to add). A failure raises: the rollback does not finish, and its job tries again. Returns the
    rows written."""
    pending = apply_pending(namespace=namespace)
    if pending.failed:
        raise WriteThroughFailed(
            f"{pending.failed} write-throughs still pending: {'; '.join(pending.errors)}"
        )
    ns = Namespace.objects.get(name=namespace)
    now = clock.now()
    written = 0
    store = legacy_store()
    tasks = Task.objects.filter(namespace=ns).order_by("task_id")
    for start in range(0, tasks.count(), _BATCH):
        batch = list(tasks[start : start + _BATCH])
        asks = [_as_claim_v1_has_it(task, ns, now) for task in batch]
        rows = store.get_many(task_ids=[task.task_id for task in batch])  # type: ignore[attr-defined]
        differences = [
            difference
            for task in batch
            if (difference := _difference(task, rows.get(task.task_id), namespace, rollback_id, now))
            is not None
        ]
        with transaction.atomic(durable=True):  # recorded as write-throughs: an observer knows them for ours
            WriteBackDifference.objects.bulk_create(differences)
            record(asks, namespace=namespace, at=now, apply_after_commit=False)
        done = apply_pending(namespace=namespace)
        if done.failed:
            raise WriteThroughFailed(f"the write-back stopped: {'; '.join(done.errors)}")
        written += len(asks)
    return written


def _difference(
    task: Task, row: LegacyClaim | None, namespace: str, rollback_id: Any, now: datetime
) -> WriteBackDifference | None:
    """A row whose completion claim.v1 does not share (completed there, not committed here; or another result)."""
    if row is None or not row.completed_by:
        return None
    committed = task.state == TaskState.COMMITTED
    if committed and row.result_digest == (task.result_digest or ""):
        return None
    return WriteBackDifference(
        namespace=namespace,
        rollback_id=rollback_id,
        task_id=task.task_id,
        table={"owner_id": row.owner_id, "completed_by": row.completed_by, "result": row.result},
        claim_v1={"state": task.state, "owner_id": task.owner_id or "", "result": task.result},
        written="REPLACED" if committed else "CLEARED",
        at=now,
    )


class WriteThroughFailed(DatabaseError):
    """The legacy table could not be brought in line with claim.v1 (a rollback waits, its job retries)."""


def _as_claim_v1_has_it(task: Task, ns: Namespace, now: datetime) -> LegacyAsk:
    fields: dict[str, Any] = {"task_id": task.task_id, "namespace": ns.name}
    if task.state == TaskState.COMMITTED:
        return LegacyAsk(
            "complete",
            {
                **fields,
                "owner_id": task.owner_id or "",
                "result": task.result,
                "result_digest": task.result_digest or "",
                "via": "claim.v1",
            },
        )
    live = (
        task.state == TaskState.CLAIMED
        and task.lease_expires_at is not None
        and task.lease_expires_at > now
        and task.scheduler_epoch >= ns.scheduler_epoch  # a fenced attempt can no longer commit
    )
    if live:
        return LegacyAsk(
            "restore", {**fields, "owner_id": task.owner_id or "", "expires_at": task.lease_expires_at}
        )
    return LegacyAsk("restore", {**fields, "owner_id": "", "expires_at": None})


def _waves(rows: list[LegacyWrite]) -> list[list[LegacyWrite]]:
    """Consecutive rows split wherever a task would appear twice (a store decides distinct tasks at once)."""
    waves: list[list[LegacyWrite]] = [[]]
    seen: set[str] = set()
    for row in rows:
        if row.task_id in seen:
            waves.append([])
            seen = set()
        waves[-1].append(row)
        seen.add(row.task_id)
    return waves


def _recorded(fields: dict[str, Any]) -> dict[str, Any]:
    """The ask's keyword arguments as JSON holds them: an expiry to the microsecond (Django's JSON encoder would
    keep milliseconds — their table would hold an expiry claim.v1 never granted)."""
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in fields.items()}


def _fields(row: LegacyWrite) -> dict[str, Any]:
    """The ask's keyword arguments as recorded (JSON: the expiry comes back as text)."""
    fields = dict(row.fields)
    if fields.get("expires_at"):
        fields["expires_at"] = datetime.fromisoformat(fields["expires_at"])
    return fields
