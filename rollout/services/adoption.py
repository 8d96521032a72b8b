"""Every row of a team's table is a claim.v1 task (docs/adopting.md, "Every row discovered"):

- **in bulk, on entering SHADOW**: ``start`` records an import (``LegacyImport``) and ``run`` reads the namespace's
  rows in key order, ``LEGACY_IMPORT_BATCH`` at a time, each batch one ``tasks_adopt`` (one INSERT … ON CONFLICT DO
  NOTHING) and one progress update — resumable from ``last_key`` — then imports the live claims (``stages``);
- **on first sight, afterwards**: a row the legacy application inserts later becomes a task when the observer reads
  it from the change stream (observe mode) or when a legacy-API or claim.v1 request names it (proxy mode) —
  ``adopt_seen``, in the namespace its mapping names.

No POST per row. A task claim.v1 already has is never touched."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from claims import clock
from claims import services as core
from claims.errors import Conflict
from claims.models import Namespace, Principal, Role, Task
from claims.services import audit

from ..legacy import legacy_store
from ..legacy_table import json_value
from ..models import LegacyDecision, LegacyImport

SIGHT = "rollout:legacy-table"  # the principal named on tasks adopted on first sight


def imports_rows() -> bool:
    """Is the legacy store a team's table whose rows are the list of tasks (``TableLegacyStore``)?"""
    return hasattr(legacy_store(), "rows_after")


def start(*, namespace: str, principal: Principal) -> LegacyImport:
    """The namespace's import, recorded RUNNING with its row count (the one already running, if any)."""
    running = LegacyImport.objects.filter(namespace=namespace, status=LegacyImport.Status.RUNNING).first()
    if running is not None:
        return running
    total = legacy_store().count(namespace=namespace)  # type: ignore[attr-defined]
    now = clock.now()
    try:
        with transaction.atomic():
            return LegacyImport.objects.create(
                namespace=namespace, principal=principal.name, total=total, started_at=now, updated_at=now
            )
    except IntegrityError:  # another start won the race: that one is the import
        return LegacyImport.objects.get(namespace=namespace, status=LegacyImport.Status.RUNNING)


def run(import_id: int, *, progress: Callable[[LegacyImport], None] | None = None) -> LegacyImport:
    """Import the rows past ``last_key``, batch by batch, then the live claims; DONE. A failure is recorded (FAILED,
    with the error) and raised; running it again resumes."""
    job = LegacyImport.objects.get(pk=import_id)
    if job.status == LegacyImport.Status.DONE:
        return job
    if job.status == LegacyImport.Status.FAILED:
        LegacyImport.objects.filter(pk=job.pk).update(status=LegacyImport.Status.RUNNING, error="")
    store, mapping = legacy_store(), legacy_store().mapping  # type: ignore[attr-defined]
    principal = Principal.objects.get(name=job.principal)
    try:
        while True:
            rows = store.rows_after(  # type: ignore[attr-defined]
                namespace=job.namespace, key=job.last_key, limit=settings.LEGACY_IMPORT_BATCH
            )
            if not rows:
                break
            created = core.tasks_adopt(
                principal=principal, namespace=job.namespace, node_id=mapping.node, tasks=rows
            )
            job.read += len(rows)
            job.created += len(created)
            job.last_key = rows[-1][0]
            LegacyImport.objects.filter(pk=job.pk).update(
                read=job.read, created=job.created, last_key=job.last_key, updated_at=Now()
            )
            if progress is not None:
                progress(job)
        job.claims = import_legacy_claims(Namespace.objects.get(name=job.namespace), principal)
    except Exception as exc:
        LegacyImport.objects.filter(pk=job.pk).update(
            status=LegacyImport.Status.FAILED, error=f"{type(exc).__name__}: {exc}"[:2000], updated_at=Now()
        )
        raise
    LegacyImport.objects.filter(pk=job.pk).update(
        status=LegacyImport.Status.DONE, claims=job.claims, updated_at=Now(), finished_at=Now()
    )
    job.refresh_from_db()
    return job


def sighted(task_id: str) -> bool:
    """Proxy mode: a row of the team's table claim.v1 has no task for yet (inserted after the import) becomes one the
    first time a request names it. True when it is a task now."""
    if not imports_rows():
        return False
    row = legacy_store().get(task_id=task_id)
    return row is not None and adopt_seen(task_id=task_id, namespace=row.namespace)


def adopt_seen(*, task_id: str, namespace: str, values: dict[str, Any] | None = None) -> bool:
    """A row of their table claim.v1 has no task for, seen now (the observer read its change, or a request named
    it): made a task of its namespace when that namespace exists (in LEGACY too: the legacy API finds its
    namespace through the task; claim.v1's API is closed there), its input from ``values`` (the row as
    the change carried it) or read from the table. True when the task of that namespace exists after; False when
    there is none, or the key is a task of another namespace (task ids are global: that row is counted unknown, never
    judged as the other namespace's task)."""
    if not namespace:
        return False
    existing = Task.objects.filter(pk=task_id).values_list("namespace__name", flat=True).first()
    if (
        existing is not None
    ):  # a task of another namespace with this key is not this row's: never judged as it
        return existing == namespace
    if not Namespace.objects.filter(name=namespace).exists():
        return False
    store = legacy_store()
    mapping = store.mapping  # type: ignore[attr-defined]
    if not mapping.input:
        value = None
    elif values is not None and mapping.input in values:
        value = json_value(values[mapping.input])
    else:
        value = store.input_of(task_id)  # type: ignore[attr-defined]
    principal = core.principal_ensure(name=SIGHT, role=Role.OPERATOR)
    core.tasks_adopt(principal=principal, namespace=namespace, node_id=mapping.node, tasks=[(task_id, value)])
    return True


def _wait_out_decisions_in_flight(namespace: str) -> None:
    """A table in another database: every legacy decision whose commit there is not yet seen has committed or
    rolled back before the import reads the live claims. Such a decision committed ours — and let the namespace's
    lock go — before theirs (``rollout.legacy.LegacyUnit``): a claim legacy granted in LEGACY could be invisible to
    an import that read between the two commits, and claim.v1 then had no attempt for a lease legacy holds (its
    owner's complete reported STALE_COMMIT_ACCEPTED). Each such row is locked and let go (``state_now``): the lock
    waits out the transaction still holding it. Called after the advance committed, so no decision routed on LEGACY
    is left to record one."""
    store = legacy_store()
    if not store.separate_database:  # decided in our transaction: committed with it
        return
    in_flight = (
        LegacyDecision.objects.filter(namespace=namespace, resolved_at__isnull=True)
        .values_list("task_id", flat=True)
        .distinct()
    )
    for task_id in in_flight:
        store.state_now(task_id)  # type: ignore[attr-defined]


def import_legacy_claims(ns: Namespace, principal: Principal) -> dict[str, Any]:
    """Entering SHADOW: every live legacy claim becomes a claim.v1 attempt (generation + 1 each), so both stores
    start equal. An owner the control plane has never seen (an old binary writing its table, without a token) is
    named as the observer names it (a worker principal with no token); what could not be imported is counted by
    reason — an owner whose name is a principal of another role, or the claim.v1 refusal (a fence between the
    advance and the import pauses claims) — and the result is audited, so an import that left claims behind is never
    silent. The lease runs to legacy's expiry, rounded up (within claim.v1's bounds)."""
    imported, skipped = 0, {}  # type: tuple[int, dict[str, int]]
    _wait_out_decisions_in_flight(ns.name)
    now = clock.now()
    for row in legacy_store().live_claims(namespace=ns.name, now=now):
        assert row.expires_at is not None  # a live claim has an expiry
        owner = Principal.objects.filter(name=row.owner_id).first() or core.principal_ensure(
            name=row.owner_id, role=Role.WORKER
        )
        if owner.role != Role.WORKER:
            skipped["NOT_A_WORKER"] = skipped.get("NOT_A_WORKER", 0) + 1
            continue
        ttl = max(
            settings.LEASE_MIN_SECONDS,
            min(settings.LEASE_MAX_SECONDS, math.ceil((row.expires_at - now).total_seconds())),
        )
        try:
            with core.acting_via("legacy"):
                core.task_claim(
                    principal=owner,
                    task_id=row.task_id,
                    owner_id=owner.name,
                    scheduler_epoch=ns.scheduler_epoch,
                    ttl_seconds=ttl,
                )
            imported += 1
        except Conflict as exc:
            skipped[exc.outcome] = skipped.get(exc.outcome, 0) + 1
    result = {"imported": imported, "skipped": skipped}
    with transaction.atomic(durable=True):
        audit(principal=principal, action="legacy_import", at=clock.now(), namespace=ns.name, detail=result)
    return result
