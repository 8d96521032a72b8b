"""Claim and claim-next: who takes a task (claim-v1.md §4). Renew, release and reaping are in ``leases``."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from .. import interleave
from ..errors import Invalid, NotClaimable, NotFound, VersionMismatch
from ..models import AcceptancePoint, Attempt, AttemptEnd, EventKind, Principal, Task, TaskState
from ..states import check_transition
from . import _sql, statements
from ._base import NamespaceHold, RejectionLog, event_statement, hold_namespace, run_guard
from .authority import acceptance_point, require_epoch_and_pause, require_owner
from .resources import take_fences


@dataclass(frozen=True)
class ClaimGrant:
    task: Task
    attempt_id: uuid.UUID
    scheduler_epoch: int
    fences: dict[str, int]

    def fields(self) -> dict[str, Any]:
        """The contract's answer to a won claim (claim-v1.md §4), as values."""
        task = self.task
        return {
            "outcome": "CLAIMED",
            "task_id": task.task_id,
            "attempt_id": self.attempt_id,
            "scheduler_epoch": self.scheduler_epoch,
            "claim_generation": task.claim_generation,
            "cancel_generation": task.cancel_generation,
            "lease_expires_at": task.lease_expires_at,
            "input_digest": task.input_digest,
            "state_version": task.state_version,
            "input": task.input,
            "fences": self.fences,
        }


def check_lease_seconds(field: str, seconds: int) -> None:
    # The serializer checks this too; services are also called by jobs and tests, so the bound lives here.
    if not settings.LEASE_MIN_SECONDS <= seconds <= settings.LEASE_MAX_SECONDS:
        raise Invalid(
            {
                field: [
                    f"must be between {settings.LEASE_MIN_SECONDS} and {settings.LEASE_MAX_SECONDS} seconds"
                ]
            }
        )


def _claimable(task: Task, ns: NamespaceHold) -> tuple[bool, str]:
    """Whether a claim may take the task now, and the NOT_CLAIMABLE reason when it may not."""
    if task.state == TaskState.READY:
        return True, ""
    if task.state == TaskState.CLAIMED:
        if task.scheduler_epoch < ns.scheduler_epoch:
            return True, ""  # the fence ended that claim
        assert task.lease_expires_at is not None  # a CLAIMED row has a lease (task_claimed_has_claim)
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

    1. Lock the task row FOR NO KEY UPDATE with its namespace FOR SHARE (``acceptance_point``), then read the database
       clock. A renew, release, commit or another claim of this task in flight is waited for, so "the lease has
       expired" is judged on the version we write over — a renew that answered RENEWED a moment ago is seen —
       and on the instant the lock was granted, not the instant we began waiting.
    2. Refuse in the contract's order: FENCED (EPOCH), CLAIMS_PAUSED, VERSION_MISMATCH,
       NOT_CLAIMABLE (STATE | LEASE_LIVE).
    3. Write the claim; the WHERE carries the (claim_generation, state_version) we decided on, a second guard.
    4. End the previous attempt, create our own, append `claimed` or `reclaimed`, take the resources' fences
       (RESOURCE_HELD rolls everything back).
    """
    check_lease_seconds("ttl_seconds", ttl_seconds)
    with acceptance_point(
        AcceptancePoint.CLAIM,
        principal=principal,
        task_id=task_id,
        scheduler_epoch=scheduler_epoch,
        owner_id=owner_id,
    ) as at:
        ns, task = at.ns, at.task
        at.require_owner()
        at.require_epoch_and_pause()
        if expected_state_version is not None and task.state_version != expected_state_version:
            raise VersionMismatch(
                f"state_version is {task.state_version}, not {expected_state_version}", current=at.current
            )
        ok, reason = _claimable(task, ns)
        if not ok:
            raise NotClaimable(f"task is {task.state}", reason=reason, current=at.current)
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
    assert task.lease_expires_at is not None  # a CLAIMED row has a lease (task_claimed_has_claim)
    return {
        "attempt_id": str(task.attempt_id),
        "owner_id": task.owner_id,
        "claim_generation": task.claim_generation,
        "ended": "epoch" if fenced_by_epoch else "lease_expired",
        "lease_expires_at": task.lease_expires_at.isoformat(),
    }


def _grant(task: Task, **kwargs: Any) -> ClaimGrant:
    """``_grant_writes`` sent at once, inside the caller's transaction."""
    writes, grant = _grant_writes(task, **kwargs)
    _sql.together(*writes)
    return grant


def _grant_writes(
    task: Task,
    *,
    previous: dict[str, Any] | None,
    ns: NamespaceHold,
    principal: Principal,
    fences: dict[str, int],
    kept: dict[str, Any],
) -> tuple[list[_sql.Statement], ClaimGrant]:
    """The writes of a won claim, once the task row carries the new claim — end the previous attempt (expired or
    fenced), create the new one, append `claimed` or `reclaimed` — not yet sent: the caller sends them in one
    statement (``_grant``), a batch all its grants' at once."""
    assert task.attempt_id is not None and task.lease_expires_at is not None  # the claim just written
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
    return writes, ClaimGrant(
        task=task, attempt_id=task.attempt_id, scheduler_epoch=ns.scheduler_epoch, fences=fences
    )


class _ResourceRace(Exception):
    """claim-next picked a task whose resource another claim took between the pick and the fence."""

    def __init__(self, task_id: str):
        self.task_id = task_id


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
    grants = task_claim_batch(
        principal=principal,
        owner_id=owner_id,
        scheduler_epoch=scheduler_epoch,
        ttl_seconds=ttl_seconds,
        max_tasks=1,
        namespace=namespace,
        node_ids=node_ids,
    )
    return grants[0] if grants else None


MAX_BATCH = 100  # claim-v1.md §9


def task_claim_batch(
    *,
    principal: Principal,
    owner_id: str,
    scheduler_epoch: int,
    ttl_seconds: int,
    max_tasks: int,
    namespace: str = "default",
    node_ids: list[str] | None = None,
) -> list[ClaimGrant]:
    """Claim up to ``max_tasks`` (1..100) claimable tasks of a namespace in one transaction, each exactly as
    ``task_claim_next`` claims one — its own attempt, generation and fences — picked one after another under the
    one namespace hold (so the epoch and the pause are judged once, on what the lock holds). Empty when nothing is
    claimable. A resource race rolls the whole batch back and it is picked again without that task."""
    check_lease_seconds("ttl_seconds", ttl_seconds)
    if not 1 <= max_tasks <= MAX_BATCH:
        raise Invalid({"max_tasks": [f"must be between 1 and {MAX_BATCH}"]})
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
                    max_tasks=max_tasks,
                )
            except _ResourceRace as race:
                passed_over.append(race.task_id)
        return []


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
    max_tasks: int,
) -> list[ClaimGrant]:
    with transaction.atomic(durable=True):
        try:
            ns = hold_namespace(name=namespace)
        except NotFound:
            raise Invalid({"namespace": [f"unknown namespace {namespace!r}"]}) from None
        log.namespace_id = ns.id
        run_guard(AcceptancePoint.CLAIM, ns)
        require_owner(principal, owner_id)
        require_epoch_and_pause(ns, scheduler_epoch)
        now_param = _sql.prep(Task, "lease_expires_at", ns.now)
        # The first pick is the plain oldest-first one (a short plan). Only when it hit a task whose resource
        # another task holds do the retries add the held-resource filter, which passes over all such tasks at once.
        held, held_params = (
            (f" AND {statements.not_held('c')}", [False, now_param]) if skip_held else ("", [])
        )
        filters, filter_params = "", []
        if node_ids:
            filters += f" AND c.node_id IN ({_sql.placeholders(node_ids)})"
            filter_params += list(node_ids)
        if passed_over:
            filters += f" AND c.task_id NOT IN ({_sql.placeholders(passed_over)})"
            filter_params += passed_over
        grants: list[ClaimGrant] = []
        ready_left = True  # once the READY pick finds nothing, the rest of a batch only reclaims
        table = Task._meta.db_table
        lease = ns.now + timedelta(seconds=ttl_seconds)
        if max_tasks > 1 and _sql.is_postgres():
            # A batch's READY picks in one statement, their attempts and events in one more.
            picked = _sql.load(
                Task,
                statements.claim_oldest_ready_many(extra=held + filters),
                [
                    TaskState.CLAIMED,
                    ns.scheduler_epoch,
                    owner_id,
                    _sql.prep(Task, "lease_expires_at", lease),
                    _sql.prep(Task, "updated_at", ns.now),
                    ns.id,
                    TaskState.READY,
                    *held_params,
                    *filter_params,
                    max_tasks,
                ],
            )
            picked.sort(key=lambda t: (t.created_at, t.task_id))
            writes: list[_sql.Statement] = []
            for task in picked:
                check_transition(TaskState.READY, TaskState.CLAIMED, "claim")
                log.task_id = task.pk
                try:
                    fences, kept = take_fences(task, ns=ns)
                except NotClaimable:
                    raise _ResourceRace(task.pk) from None
                more, grant = _grant_writes(
                    task, previous=None, ns=ns, principal=principal, fences=fences, kept=kept
                )
                writes += more
                grants.append(grant)
            if writes:
                _sql.together(*writes)
            ready_left = len(picked) == max_tasks
        while len(grants) < max_tasks:
            attempt_id = uuid.uuid4()
            claimed = (
                _sql.load(
                    Task,
                    statements.claim_oldest_ready(extra=held + filters),
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
                if ready_left
                else []
            )
            previous = None
            if claimed:
                task = claimed[0]
                check_transition(TaskState.READY, TaskState.CLAIMED, "claim")
            else:
                ready_left = False
                # Nothing READY: reclaim the claim whose lease ran out first (or that a fence ended).
                task = _sql.select_one(
                    Task,
                    {"namespace_id": ns.id, "state": TaskState.CLAIMED},
                    also="(lease_expires_at <= %s OR scheduler_epoch < %s)"
                    + (f" AND {statements.not_held(table)}" if skip_held else "")
                    + filters.replace("c.", f"{table}."),
                    also_params=[now_param, ns.scheduler_epoch, *held_params, *filter_params],
                    tail=f" ORDER BY lease_expires_at, task_id LIMIT 1{_sql.lock_clause('FOR NO KEY UPDATE SKIP LOCKED')}",
                )
                if task is None:
                    break
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
            grants.append(
                _grant(task, previous=previous, ns=ns, principal=principal, fences=fences, kept=kept)
            )
        return grants
