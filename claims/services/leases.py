"""Renew, release and reaping: how long a claim lasts, and how it ends (claim-v1.md §4). Taking a task is in
``claiming``; the checks every acceptance point shares are in ``authority``."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.db import transaction
from django.db.models import Exists, OuterRef

from .. import clock, interleave
from ..errors import Expired
from ..models import (
    AcceptancePoint,
    Attempt,
    AttemptEnd,
    EventKind,
    Principal,
    Task,
    TaskEvent,
    TaskState,
)
from ..states import check_transition
from . import _sql, wakeups
from ._base import append_event, event_statement, new_event, settle, task_let_go
from .authority import Named, acceptance_point
from .claiming import check_lease_seconds
from .resources import check_renew_resources


def task_renew(
    *,
    principal: Principal,
    task_id: str,
    attempt_id: uuid.UUID,
    claim_generation: int,
    owner_id: str,
    scheduler_epoch: int,
    cancel_generation: int,
    extend_seconds: int,
) -> Task:
    """Extend the current attempt's lease to server-now + extend_seconds (bounded by settings).

    409s in the contract's order: CANCELLED, FENCED (EPOCH | GENERATION | ATTEMPT | OWNER), EXPIRED. An
    expired lease is never revived, even when nobody has reclaimed the task yet: the owner must claim again.
    """
    check_lease_seconds("extend_seconds", extend_seconds)
    named = Named(attempt_id, claim_generation, scheduler_epoch, owner_id)
    with acceptance_point(AcceptancePoint.RENEW, principal=principal, task_id=task_id, named=named) as at:
        task = at.task
        at.require_owner()
        at.resolve_attempt()
        keys = at.hold_keys()  # locked before anything is decided; the clock is read after them
        at.require_not_cancelled(cancel_generation)
        at.require_current_attempt()
        at.require_live_lease(Expired, "the lease ran out: claim again")
        ns = at.ns
        check_renew_resources(task, keys)
        interleave.reach("task_renew.checked")
        task.lease_expires_at = ns.now + timedelta(seconds=extend_seconds)
        task.updated_at = ns.now
        _sql.together(
            _sql.update_statement(
                Task, {"task_id": task_id}, lease_expires_at=task.lease_expires_at, updated_at=ns.now
            ),
            event_statement(
                EventKind.RENEWED,
                **at.event_fields(detail={"lease_expires_at": task.lease_expires_at.isoformat()}),
            ),
        )
        settle(AcceptancePoint.RENEW, ns, task)
    return task


def task_release(
    *,
    principal: Principal,
    task_id: str,
    attempt_id: uuid.UUID,
    claim_generation: int,
    owner_id: str,
    scheduler_epoch: int,
) -> Task:
    """Give the task back: READY, the attempt ends, its staged results can no longer be committed.

    Conditional on naming the current attempt (FENCED otherwise), so a stale release never removes a newer
    owner's claim. Releasing after one's own lease expired, with nobody else holding the task, is allowed.
    """
    named = Named(attempt_id, claim_generation, scheduler_epoch, owner_id)
    with acceptance_point(AcceptancePoint.RELEASE, principal=principal, task_id=task_id, named=named) as at:
        ns, task = at.ns, at.task
        at.require_owner()
        at.resolve_attempt()
        at.require_current_attempt()
        check_transition(task.state, TaskState.READY, "release")
        _sql.update(
            Attempt,
            {"attempt_id": attempt_id, "ended_at": None},
            ended_at=ns.now,
            end_reason=AttemptEnd.RELEASED,
        )
        task_let_go(task, TaskState.READY, ns.now)
        append_event(EventKind.RELEASED, **at.event_fields())
        wakeups.claimable(ns.name, nodes=[task.node_id])
        wakeups.keys_freed(task.resources)
        settle(AcceptancePoint.RELEASE, ns, task)
    return task


def leases_reap(*, limit: int = 500) -> int:
    """Record `lease_expired` once for every claim whose lease ran out and that nobody has reclaimed yet (the task
    stays CLAIMED; the next claim is a reclaim). Keeps timelines and the frontier's story accurate and feeds the
    reclamation-latency metric. Idempotent: an attempt already reaped is skipped. Returns how many it recorded."""
    # The expired rows are locked (SKIP LOCKED: a renew or claim deciding on one now is passed over, not waited
    # for), so a renew cannot commit between our read and our `lease_expired` — the timeline never says a lease
    # ran out that was renewed. No lock wait, so the clock read first is still the decision's instant.
    with transaction.atomic(durable=True):
        now = clock.now()
        reaped = TaskEvent.objects.filter(
            kind=EventKind.LEASE_EXPIRED, task_id=OuterRef("pk"), attempt_id=OuterRef("attempt_id")
        )
        expired = list(
            Task.objects.select_for_update(skip_locked=True, no_key=True)
            .filter(state=TaskState.CLAIMED, lease_expires_at__lte=now)
            .exclude(Exists(reaped))
            .values_list(
                "task_id",
                "namespace_id",
                "attempt_id",
                "claim_generation",
                "scheduler_epoch",
                "owner_id",
                "lease_expires_at",
            )[:limit]
        )
        TaskEvent.objects.bulk_create(
            [
                new_event(
                    EventKind.LEASE_EXPIRED,
                    namespace_id=ns_id,
                    task_id=task_id,
                    at=now,
                    principal=None,
                    attempt_id=attempt_id,
                    claim_generation=generation,
                    scheduler_epoch=epoch,
                    owner_id=owner,
                    detail={"lease_expires_at": lease.isoformat() if lease else None},
                )
                for task_id, ns_id, attempt_id, generation, epoch, owner, lease in expired
            ]
        )
        return len(expired)
