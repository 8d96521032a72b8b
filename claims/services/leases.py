"""Claim, claim-next, renew, release: who holds a task, and for how long (claim-v1.md §4)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef

from .. import clock, interleave
from ..errors import (
    Cancelled,
    ClaimsPaused,
    Expired,
    Fenced,
    Forbidden,
    Invalid,
    NotClaimable,
    NotFound,
    VersionMismatch,
)
from ..models import AcceptancePoint, Attempt, AttemptEnd, EventKind, Principal, Task, TaskEvent, TaskState
from ..states import check_transition
from . import _sql
from ._base import (
    NamespaceHold,
    RejectionLog,
    append_event,
    event_statement,
    hold_namespace,
    hold_task,
    new_event,
    task_current,
)
from .resources import check_renew_resources, lock_keys, take_fences


@dataclass(frozen=True)
class ClaimGrant:
    task: Task
    attempt_id: uuid.UUID
    scheduler_epoch: int
    fences: dict[str, int]


def _check_lease_seconds(field: str, seconds: int) -> None:
    # The serializer checks this too; services are also called by jobs and tests, so the bound lives here.
    if not settings.LEASE_MIN_SECONDS <= seconds <= settings.LEASE_MAX_SECONDS:
        raise Invalid(
            {
                field: [
                    f"must be between {settings.LEASE_MIN_SECONDS} and {settings.LEASE_MAX_SECONDS} seconds"
                ]
            }
        )


def _check_owner(principal: Principal, owner_id: str) -> None:
    if principal.owner_id != owner_id:
        raise Forbidden(f"this token acts as {principal.owner_id!r}, not {owner_id!r}")


def _check_epoch_and_pause(ns: NamespaceHold, scheduler_epoch: int) -> None:
    if scheduler_epoch != ns.scheduler_epoch:
        raise Fenced(
            f"scheduler_epoch {scheduler_epoch} is not the namespace's current epoch {ns.scheduler_epoch}",
            reason="EPOCH",
            current={"scheduler_epoch": ns.scheduler_epoch},
        )
    if ns.claims_paused:
        raise ClaimsPaused(
            f"claims are paused in namespace {ns.name}",
            current={"scheduler_epoch": ns.scheduler_epoch, "claims_paused": True},
        )


def _claimable(task: Task, ns: NamespaceHold) -> tuple[bool, str]:
    """Whether a claim may take the task now, and the NOT_CLAIMABLE reason when it may not."""
    if task.state == TaskState.READY:
        return True, ""
    if task.state == TaskState.CLAIMED:
        if task.scheduler_epoch < ns.scheduler_epoch:
            return True, ""  # the fence ended that claim
        if task.lease_expires_at <= ns.now:
            return True, ""  # a reclaim
        return False, "LEASE_LIVE"
    return False, "STATE"


def _claim_values(
    task: Task, *, ns: NamespaceHold, owner_id: str, ttl_seconds: int, attempt_id: uuid.UUID
) -> dict[str, Any]:
    return {
        "state": TaskState.CLAIMED,
        "claim_generation": task.claim_generation + 1,
        "state_version": task.state_version + 1,
        "scheduler_epoch": ns.scheduler_epoch,
        "attempt_id": attempt_id,
        "owner_id": owner_id,
        "lease_expires_at": ns.now + timedelta(seconds=ttl_seconds),
        "updated_at": ns.now,
    }


def _apply(task: Task, values: dict[str, Any]) -> Task:
    for key, value in values.items():
        setattr(task, key, value)
    return task


def task_claim(
    *,
    principal: Principal,
    task_id: str,
    owner_id: str,
    scheduler_epoch: int,
    ttl_seconds: int,
    expected_state_version: int | None = None,
) -> ClaimGrant:
    """Claim one task. One transaction, every decision on what the task lock holds still:

    1. Lock the task row FOR NO KEY UPDATE with its namespace FOR SHARE (``hold_task``), then read the database
       clock. A renew, release, commit or another claim of this task in flight is waited for, so "the lease has
       expired" is judged on the version we write over — a renew that answered RENEWED a moment ago is seen —
       and on the instant the lock was granted, not the instant we began waiting.
    2. Refuse in the contract's order: FENCED (EPOCH), CLAIMS_PAUSED, VERSION_MISMATCH,
       NOT_CLAIMABLE (STATE | LEASE_LIVE).
    3. Write the claim; the WHERE carries the (claim_generation, state_version) we decided on, a second guard.
    4. End the previous attempt, create our own, append `claimed` or `reclaimed`, take the resources' fences
       (RESOURCE_HELD rolls everything back).
    """
    _check_lease_seconds("ttl_seconds", ttl_seconds)
    log = RejectionLog(
        AcceptancePoint.CLAIM,
        principal=principal,
        task_id=task_id,
        scheduler_epoch=scheduler_epoch,
        owner_id=owner_id,
    )
    with log, transaction.atomic(durable=True):
        ns, task = hold_task(task_id)
        log.namespace_id = ns.id
        _check_owner(principal, owner_id)
        _check_epoch_and_pause(ns, scheduler_epoch)
        if expected_state_version is not None and task.state_version != expected_state_version:
            raise VersionMismatch(
                f"state_version is {task.state_version}, not {expected_state_version}",
                current=task_current(task, ns),
            )
        ok, reason = _claimable(task, ns)
        if not ok:
            raise NotClaimable(f"task is {task.state}", reason=reason, current=task_current(task, ns))
        check_transition(
            task.state, TaskState.CLAIMED, "reclaim" if task.state == TaskState.CLAIMED else "claim"
        )
        interleave.reach("task_claim.read")
        values = _claim_values(
            task, ns=ns, owner_id=owner_id, ttl_seconds=ttl_seconds, attempt_id=uuid.uuid4()
        )
        won = _sql.update(
            Task,
            {
                "task_id": task_id,
                "claim_generation": task.claim_generation,
                "state_version": task.state_version,
            },
            **values,
        )
        assert won == 1, "a locked row changed under us"
        previous = _previous_claim(task, ns) if task.state == TaskState.CLAIMED else None
        _apply(task, values)
        # RESOURCE_HELD here rolls the whole transaction back, the claim's write included.
        fences, kept = take_fences(task, ns=ns)
        grant = _grant(task, previous=previous, ns=ns, principal=principal, fences=fences, kept=kept)
    return grant


def _previous_claim(task: Task, ns: NamespaceHold) -> dict[str, Any]:
    """The claim a reclaim ends, read before the row is overwritten."""
    fenced_by_epoch = task.scheduler_epoch < ns.scheduler_epoch
    return {
        "attempt_id": str(task.attempt_id),
        "owner_id": task.owner_id,
        "claim_generation": task.claim_generation,
        "ended": "epoch" if fenced_by_epoch else "lease_expired",
        "lease_expires_at": task.lease_expires_at.isoformat(),
    }


def _grant(
    task: Task,
    *,
    previous: dict[str, Any] | None,
    ns: NamespaceHold,
    principal: Principal,
    fences: dict[str, int],
    kept: dict[str, Any],
) -> ClaimGrant:
    """The writes of a won claim, inside the caller's transaction, once the task row carries the new claim:
    end the previous attempt (expired or fenced), create the new one, append `claimed` or `reclaimed`."""
    writes = []
    if previous is not None:
        writes.append(
            _sql.update_statement(
                Attempt,
                {"attempt_id": uuid.UUID(previous["attempt_id"]), "ended_at": None},
                ended_at=ns.now,
                end_reason=AttemptEnd.FENCED if previous["ended"] == "epoch" else AttemptEnd.RECLAIMED,
            )
        )
    writes.append(
        _sql.insert_statement(
            Attempt,
            attempt_id=task.attempt_id,
            task_id=task.task_id,
            namespace_id=ns.id,
            owner_id=task.owner_id,
            pool=principal.pool,
            claim_generation=task.claim_generation,
            scheduler_epoch=ns.scheduler_epoch,
            cancel_generation=task.cancel_generation,
            input_digest=task.input_digest,
            fences=kept,
            started_at=ns.now,
        )
    )
    detail: dict[str, Any] = {"lease_expires_at": task.lease_expires_at.isoformat()}
    if previous is not None:
        detail["previous"] = previous
    writes.append(
        event_statement(
            EventKind.RECLAIMED if previous else EventKind.CLAIMED,
            namespace_id=ns.id,
            task_id=task.task_id,
            at=ns.now,
            principal=principal,
            attempt_id=task.attempt_id,
            claim_generation=task.claim_generation,
            scheduler_epoch=ns.scheduler_epoch,
            owner_id=task.owner_id,
            point=AcceptancePoint.CLAIM,
            detail=detail,
        )
    )
    _sql.together(*writes)
    return ClaimGrant(
        task=task, attempt_id=task.attempt_id, scheduler_epoch=ns.scheduler_epoch, fences=fences
    )


class _ResourceRace(Exception):
    """claim-next picked a task whose resource another claim took between the pick and the fence."""

    def __init__(self, task_id: str):
        self.task_id = task_id


def _not_held(outer: str) -> str:
    """SQL: no resource of task ``outer`` is held by a live attempt of another task (§4: such tasks are passed
    over). Live = the newest token's taker is still its task's current claim, unexpired, in its current epoch."""
    # The flag first: for the common task without resources the sub-select is never run (PostgreSQL plans it as
    # a per-row SubPlan behind the OR instead of an anti-join over every live claim).
    return (
        f"({outer}.has_resources = %s OR NOT EXISTS (SELECT 1 FROM claims_taskresource tr "
        "JOIN claims_resourcekey rk ON rk.resource_key = tr.resource_key_id "
        "JOIN claims_task h ON h.task_id = rk.holder_task_id JOIN claims_namespace hn ON hn.id = h.namespace_id "
        f"WHERE tr.task_id = {outer}.task_id AND h.task_id <> {outer}.task_id AND h.state = 'CLAIMED' "
        "AND h.attempt_id = rk.holder_attempt_id AND h.lease_expires_at > %s AND h.scheduler_epoch = hn.scheduler_epoch))"
    )


def task_claim_next(
    *,
    principal: Principal,
    owner_id: str,
    scheduler_epoch: int,
    ttl_seconds: int,
    namespace: str = "default",
    node_ids: list[str] | None = None,
) -> ClaimGrant | None:
    """Claim the oldest claimable task of a namespace, or None when nothing is claimable (the API's 204).

    Candidates are taken with SELECT … FOR NO KEY UPDATE SKIP LOCKED: a row another claimer is deciding on is
    passed over instead of waited for, so concurrent callers never receive the same task and never herd on one
    row. READY tasks come first (oldest first), then claims whose lease ran out or whose epoch was fenced. Tasks
    whose resources a live attempt of another task holds are passed over; if another claim takes such a resource
    between our pick and our fence, the transaction rolls back and we pick again without that task.
    """
    _check_lease_seconds("ttl_seconds", ttl_seconds)
    log = RejectionLog(
        AcceptancePoint.CLAIM, principal=principal, scheduler_epoch=scheduler_epoch, owner_id=owner_id
    )
    passed_over: list[str] = []
    with log:
        for attempt in range(8):
            try:
                return _claim_next_once(
                    log,
                    skip_held=attempt > 0,
                    principal=principal,
                    owner_id=owner_id,
                    scheduler_epoch=scheduler_epoch,
                    ttl_seconds=ttl_seconds,
                    namespace=namespace,
                    node_ids=node_ids,
                    passed_over=passed_over,
                )
            except _ResourceRace as race:
                passed_over.append(race.task_id)
        return None


def _claim_next_once(
    log: RejectionLog,
    *,
    skip_held: bool,
    principal: Principal,
    owner_id: str,
    scheduler_epoch: int,
    ttl_seconds: int,
    namespace: str,
    node_ids: list[str] | None,
    passed_over: list[str],
) -> ClaimGrant | None:
    with transaction.atomic(durable=True):
        try:
            ns = hold_namespace(name=namespace)
        except NotFound:
            raise Invalid({"namespace": [f"unknown namespace {namespace!r}"]}) from None
        log.namespace_id = ns.id
        _check_owner(principal, owner_id)
        _check_epoch_and_pause(ns, scheduler_epoch)
        now_param = _sql.prep(Task, "lease_expires_at", ns.now)
        # The first pick is the plain oldest-first one (a short plan). Only when it hit a task whose resource
        # another task holds do the retries add the held-resource filter, which passes over all such tasks at once.
        held, held_params = (f" AND {_not_held('c')}", [False, now_param]) if skip_held else ("", [])
        filters, filter_params = "", []
        if node_ids:
            filters += f" AND c.node_id IN ({_sql.placeholders(node_ids)})"
            filter_params += list(node_ids)
        if passed_over:
            filters += f" AND c.task_id NOT IN ({_sql.placeholders(passed_over)})"
            filter_params += passed_over
        skip_locked = _sql.lock_clause("FOR NO KEY UPDATE SKIP LOCKED")
        attempt_id = uuid.uuid4()
        lease = ns.now + timedelta(seconds=ttl_seconds)
        table = Task._meta.db_table
        # The common case in one statement: lock the oldest READY task nobody else is deciding on and claim it.
        # The sub-select's SKIP LOCKED passes over rows other claimers hold, so N callers take N different tasks.
        claimed = _sql.load(
            Task,
            f"UPDATE {table} SET state = %s, claim_generation = claim_generation + 1, "
            "state_version = state_version + 1, scheduler_epoch = %s, attempt_id = %s, owner_id = %s, "
            "lease_expires_at = %s, updated_at = %s "
            f"WHERE task_id = (SELECT c.task_id FROM {table} c WHERE c.namespace_id = %s AND c.state = %s"
            f"{held}{filters} ORDER BY c.created_at, c.task_id LIMIT 1{skip_locked}) RETURNING *",
            [
                TaskState.CLAIMED,
                ns.scheduler_epoch,
                _sql.prep(Task, "attempt_id", attempt_id),
                owner_id,
                _sql.prep(Task, "lease_expires_at", lease),
                _sql.prep(Task, "updated_at", ns.now),
                ns.id,
                TaskState.READY,
                *held_params,
                *filter_params,
            ],
        )
        previous = None
        if claimed:
            task = claimed[0]
            check_transition(TaskState.READY, TaskState.CLAIMED, "claim")
        else:
            # Nothing READY: reclaim the claim whose lease ran out first (or that a fence ended).
            task = _sql.select_one(
                Task,
                {"namespace_id": ns.id, "state": TaskState.CLAIMED},
                also="(lease_expires_at <= %s OR scheduler_epoch < %s)"
                + (f" AND {_not_held(table)}" if skip_held else "")
                + filters.replace("c.", f"{table}."),
                also_params=[now_param, ns.scheduler_epoch, *held_params, *filter_params],
                tail=f" ORDER BY lease_expires_at, task_id LIMIT 1{skip_locked}",
            )
            if task is None:
                return None
            check_transition(task.state, TaskState.CLAIMED, "reclaim")
            previous = _previous_claim(task, ns)
            values = _claim_values(
                task, ns=ns, owner_id=owner_id, ttl_seconds=ttl_seconds, attempt_id=attempt_id
            )
            # We hold the row lock; the generation in the WHERE is a second guard, not the race's closer.
            updated = _sql.update(
                Task, {"task_id": task.pk, "claim_generation": task.claim_generation}, **values
            )
            assert updated == 1, "a locked row changed under us"
            _apply(task, values)
        log.task_id = task.pk
        try:
            fences, kept = take_fences(task, ns=ns)
        except NotClaimable:
            raise _ResourceRace(task.pk) from None
        return _grant(task, previous=previous, ns=ns, principal=principal, fences=fences, kept=kept)


def resolve_attempt(task: Task, attempt_id: uuid.UUID, principal: Principal) -> int | None:
    """The epoch ``attempt_id`` was granted under, or None when no such attempt of this task exists.

    Raises Forbidden when the attempt belongs to another owner: a worker acts only on its own attempts.
    The current attempt is read off the locked task row; only an older one costs a query.
    """
    if task.attempt_id == attempt_id:
        owner, epoch = task.owner_id, task.scheduler_epoch
    else:
        row = (
            Attempt.objects.filter(pk=attempt_id, task_id=task.pk)
            .values_list("owner_id", "scheduler_epoch")
            .first()
        )
        if row is None:
            return None
        owner, epoch = row
    if owner != principal.owner_id:
        raise Forbidden(f"attempt {attempt_id} is not {principal.owner_id!r}'s")
    return epoch


def check_authority(
    task: Task,
    ns: NamespaceHold,
    *,
    attempt_id: uuid.UUID,
    claim_generation: int,
    scheduler_epoch: int,
    granted_epoch: int | None,
    owner_id: str | None = None,
) -> None:
    """FENCED unless the request names the task's current, live-by-epoch attempt. Reasons in order:
    EPOCH (the epoch rule of §1: the carried epoch is old, or the attempt was granted before a fence — re-sending
    the new epoch does not revive it), GENERATION, ATTEMPT (another attempt, or the attempt has ended), OWNER."""
    current = task_current(task, ns)
    if scheduler_epoch != ns.scheduler_epoch or (
        granted_epoch is not None and granted_epoch != ns.scheduler_epoch
    ):
        raise Fenced("an epoch fence ended this attempt: claim again", reason="EPOCH", current=current)
    if claim_generation != task.claim_generation:
        raise Fenced(
            f"claim_generation {claim_generation} is not current ({task.claim_generation})",
            reason="GENERATION",
            current=current,
        )
    if attempt_id != task.attempt_id or task.state != TaskState.CLAIMED:
        raise Fenced("this attempt is not the task's current claim", reason="ATTEMPT", current=current)
    if owner_id is not None and owner_id != task.owner_id:
        raise Fenced("the claim belongs to another owner", reason="OWNER", current=current)


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
    _check_lease_seconds("extend_seconds", extend_seconds)
    log = RejectionLog(
        AcceptancePoint.RENEW,
        principal=principal,
        task_id=task_id,
        attempt_id=attempt_id,
        claim_generation=claim_generation,
        scheduler_epoch=scheduler_epoch,
        owner_id=owner_id,
    )
    with log, transaction.atomic(durable=True):
        ns, task = hold_task(task_id)
        log.namespace_id = ns.id
        _check_owner(principal, owner_id)
        granted_epoch = resolve_attempt(task, attempt_id, principal)
        keys = []
        if task.resources:  # locked before anything is decided; the clock is read after them
            keys, db_now = lock_keys(sorted(task.resources), lock="FOR SHARE")
            ns = ns.at(db_now)
        if task.state == TaskState.CANCELLED or cancel_generation != task.cancel_generation:
            raise Cancelled("the task was cancelled", current=task_current(task, ns))
        check_authority(
            task,
            ns,
            attempt_id=attempt_id,
            claim_generation=claim_generation,
            scheduler_epoch=scheduler_epoch,
            granted_epoch=granted_epoch,
            owner_id=owner_id,
        )
        if task.lease_expires_at <= ns.now:
            raise Expired("the lease ran out: claim again", current=task_current(task, ns))
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
                namespace_id=ns.id,
                task_id=task_id,
                at=ns.now,
                principal=principal,
                attempt_id=attempt_id,
                claim_generation=claim_generation,
                scheduler_epoch=ns.scheduler_epoch,
                owner_id=owner_id,
                point=AcceptancePoint.RENEW,
                detail={"lease_expires_at": task.lease_expires_at.isoformat()},
            ),
        )
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
    log = RejectionLog(
        AcceptancePoint.RELEASE,
        principal=principal,
        task_id=task_id,
        attempt_id=attempt_id,
        claim_generation=claim_generation,
        scheduler_epoch=scheduler_epoch,
        owner_id=owner_id,
    )
    with log, transaction.atomic(durable=True):
        ns, task = hold_task(task_id)
        log.namespace_id = ns.id
        _check_owner(principal, owner_id)
        granted_epoch = resolve_attempt(task, attempt_id, principal)
        check_authority(
            task,
            ns,
            attempt_id=attempt_id,
            claim_generation=claim_generation,
            scheduler_epoch=scheduler_epoch,
            granted_epoch=granted_epoch,
            owner_id=owner_id,
        )
        check_transition(task.state, TaskState.READY, "release")
        _sql.update(
            Attempt,
            {"attempt_id": attempt_id, "ended_at": None},
            ended_at=ns.now,
            end_reason=AttemptEnd.RELEASED,
        )
        task.state = TaskState.READY
        task.state_version += 1
        task.attempt_id = task.owner_id = task.lease_expires_at = None
        task.updated_at = ns.now
        task.save(
            update_fields=[
                "state",
                "state_version",
                "attempt_id",
                "owner_id",
                "lease_expires_at",
                "updated_at",
            ]
        )
        append_event(
            EventKind.RELEASED,
            namespace_id=ns.id,
            task_id=task_id,
            at=ns.now,
            principal=principal,
            attempt_id=attempt_id,
            claim_generation=claim_generation,
            scheduler_epoch=ns.scheduler_epoch,
            owner_id=owner_id,
            point=AcceptancePoint.RELEASE,
        )
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
                    detail={"lease_expires_at": lease.isoformat()},
                )
                for task_id, ns_id, attempt_id, generation, epoch, owner, lease in expired
            ]
        )
        return len(expired)
