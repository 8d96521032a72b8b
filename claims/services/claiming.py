"""Claim a named task: who takes it (claim-v1.md §4), and the writes of a grant that claim-next and batch claims
(``picking``) share. Renew, release and reaping are in ``leases``."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils.dateparse import parse_datetime

from .. import interleave
from ..errors import Invalid, NotClaimable, VersionMismatch
from ..models import AcceptancePoint, Attempt, AttemptEnd, EventKind, Principal, Task, TaskState
from ..states import check_transition
from . import _sql, claim_keys
from ._base import NamespaceHold, event_statement, settle
from .authority import Named, acceptance_point
from .resources import KeysForClaims


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

    @classmethod
    def stored(cls, fields: dict[str, Any]) -> ClaimGrant:
        """A grant as it was answered (``fields()`` as JSON, kept under its request's key: ``claim_keys``)."""
        expires = fields["lease_expires_at"]
        task = Task(
            task_id=fields["task_id"],
            claim_generation=fields["claim_generation"],
            cancel_generation=fields["cancel_generation"],
            lease_expires_at=parse_datetime(expires) if isinstance(expires, str) else expires,
            input_digest=fields["input_digest"],
            state_version=fields["state_version"],
            input=fields["input"],
        )
        return cls(
            task=task,
            attempt_id=uuid.UUID(str(fields["attempt_id"])),
            scheduler_epoch=fields["scheduler_epoch"],
            fences=fields["fences"],
        )


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


def claim_values(
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


def apply_values(task: Task, values: dict[str, Any]) -> Task:
    for key, value in values.items():
        setattr(task, key, value)
    return task


@claim_keys.once
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
    3. Lock the task's resource keys FOR UPDATE in key order and read the clock again: a key held by a live
       attempt of another task is NOT_CLAIMABLE (RESOURCE_HELD), judged on that clock — and the grant's attempt
       starts, and its lease runs, from that same clock (``KeysForClaims``).
    4. Write the claim; the WHERE carries the (claim_generation, state_version) we decided on, a second guard.
    5. End the previous attempt, create our own, append `claimed` or `reclaimed`, take the keys' next fence
       tokens — the writes in one round trip.
    """
    check_lease_seconds("ttl_seconds", ttl_seconds)
    named = Named(scheduler_epoch=scheduler_epoch, owner_id=owner_id)
    with acceptance_point(AcceptancePoint.CLAIM, principal=principal, task_id=task_id, named=named) as at:
        ns, task = at.ns, at.task
        at.require_owner()
        key = claim_keys.reserved(principal, ns)
        if key.replay is not None:
            return ClaimGrant.stored(key.replay[0])
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
        # RESOURCE_HELD here rolls the whole transaction back. The grant is written on the clock read once the
        # keys are locked: the previous holder was judged on it, so the new attempt starts on it too.
        keys = KeysForClaims(ns).lock([task])
        keys.require_free(task)
        previous = previous_claim(task, keys.ns) if task.state == TaskState.CLAIMED else None
        values = claim_values(
            task, ns=keys.ns, owner_id=owner_id, ttl_seconds=ttl_seconds, attempt_id=uuid.uuid4()
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
        apply_values(task, values)
        fences, kept, key_writes = keys.take(task)
        writes, grant = grant_writes(
            task, previous=previous, ns=keys.ns, principal=principal, fences=fences, kept=kept
        )
        _sql.together(*key_writes, *writes)
        settle(AcceptancePoint.CLAIM, keys.ns, grant)
        key.keep([grant])
    return grant


def previous_claim(task: Task, ns: NamespaceHold) -> dict[str, Any]:
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


def grant_writes(
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
    statement, a batch all its grants' at once (``_Batch.send``)."""
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
            **ns.on(
                task.task_id,
                principal,
                attempt_id=task.attempt_id,
                claim_generation=task.claim_generation,
                scheduler_epoch=ns.scheduler_epoch,
                owner_id=task.owner_id,
                point=AcceptancePoint.CLAIM,
                detail=detail,
            ),
        )
    )
    return writes, ClaimGrant(
        task=task, attempt_id=task.attempt_id, scheduler_epoch=ns.scheduler_epoch, fences=fences
    )
