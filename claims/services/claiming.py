"""Claim and claim-next: who takes a task (claim-v1.md §4). Renew, release and reaping are in ``leases``."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils.dateparse import parse_datetime

from .. import interleave
from ..errors import Invalid, NotClaimable, NotFound, VersionMismatch
from ..models import AcceptancePoint, Attempt, AttemptEnd, EventKind, Principal, Task, TaskState
from ..states import check_transition
from . import _sql, claim_keys, statements
from ._base import NamespaceHold, RejectionLog, event_statement, hold_namespace, run_guard, settle
from .authority import Named, acceptance_point, require_epoch_and_pause, require_owner
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
        previous = _previous_claim(task, keys.ns) if task.state == TaskState.CLAIMED else None
        values = _claim_values(
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
        _apply(task, values)
        fences, kept, key_writes = keys.take(task)
        writes, grant = _grant_writes(
            task, previous=previous, ns=keys.ns, principal=principal, fences=fences, kept=kept
        )
        _sql.together(*key_writes, *writes)
        settle(AcceptancePoint.CLAIM, keys.ns, grant)
        key.keep([grant])
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


def task_claim_next(
    *,
    principal: Principal,
    owner_id: str,
    scheduler_epoch: int,
    ttl_seconds: int,
    namespace: str = "default",
    node_ids: list[str] | None = None,
    passed_over: list[str] | None = None,
) -> ClaimGrant | None:
    """Claim the oldest claimable task of a namespace, or None when nothing is claimable (the API's 204): a batch
    of one (``task_claim_batch``)."""
    grants = task_claim_batch(
        principal=principal,
        owner_id=owner_id,
        scheduler_epoch=scheduler_epoch,
        ttl_seconds=ttl_seconds,
        max_tasks=1,
        namespace=namespace,
        node_ids=node_ids,
        passed_over=passed_over,
    )
    return grants[0] if grants else None


MAX_BATCH = 100  # claim-v1.md §9


@claim_keys.once
def task_claim_batch(
    *,
    principal: Principal,
    owner_id: str,
    scheduler_epoch: int,
    ttl_seconds: int,
    max_tasks: int,
    namespace: str = "default",
    node_ids: list[str] | None = None,
    passed_over: list[str] | None = None,
) -> list[ClaimGrant]:
    """Claim up to ``max_tasks`` (1..100) claimable tasks of a namespace in one transaction, each exactly as a
    single claim — its own attempt, generation and fences — under the one namespace hold (the epoch and the pause
    judged once, on what the lock holds). Empty only when nothing is claimable. ``passed_over``: tasks not to take.

    Candidates are taken with SKIP LOCKED: a row another claimer is deciding on is passed over instead of waited
    for, so concurrent callers never receive the same task and never herd on one row. READY tasks come first
    (oldest first), then claims whose lease ran out or whose epoch was fenced. A candidate that lists resources
    is taken only if none of its keys is held by a live attempt of another task or by an earlier grant of this
    batch (at most one task per key), judged on the keys locked — never a rollback of the whole batch: a task
    that may not be taken is passed over and the batch picks on, so it answers nothing only when nothing remains
    that it may take.
    """
    check_lease_seconds("ttl_seconds", ttl_seconds)
    if not 1 <= max_tasks <= MAX_BATCH:
        raise Invalid({"max_tasks": [f"must be between 1 and {MAX_BATCH}"]})
    log = RejectionLog(
        AcceptancePoint.CLAIM, principal=principal, scheduler_epoch=scheduler_epoch, owner_id=owner_id
    )
    with log, transaction.atomic(durable=True):
        try:
            ns = hold_namespace(name=namespace)
        except NotFound:
            raise Invalid({"namespace": [f"unknown namespace {namespace!r}"]}) from None
        log.namespace_id = ns.id
        run_guard(AcceptancePoint.CLAIM, ns)
        require_owner(principal, owner_id)
        key = claim_keys.reserved(principal, ns)
        if key.replay is not None:
            return [ClaimGrant.stored(fields) for fields in key.replay]
        require_epoch_and_pause(ns, scheduler_epoch)
        batch = _Batch(
            ns=ns,
            principal=principal,
            owner_id=owner_id,
            ttl_seconds=ttl_seconds,
            max_tasks=max_tasks,
            node_ids=node_ids or [],
            passed_over=list(passed_over or []),
        )
        for reclaim in (False, True):
            batch.fill(reclaim=reclaim)
        batch.send()
        settle(AcceptancePoint.CLAIM, ns, batch.grants)
        key.keep(batch.grants)
        return batch.grants


@dataclass
class _Batch:
    """One claim transaction's picks and grants (``task_claim_batch``)."""

    ns: NamespaceHold
    principal: Principal
    owner_id: str
    ttl_seconds: int
    max_tasks: int
    node_ids: list[str]
    passed_over: list[str]
    grants: list[ClaimGrant] = field(default_factory=list)
    writes: list[_sql.Statement] = field(default_factory=list)
    skip_held: bool = False  # once a task with a held key was met, picks pass over all such tasks at once
    keys: KeysForClaims | None = None  # the keys this transaction locked, once it locked any

    def fill(self, *, reclaim: bool) -> None:
        """Pick and grant until the batch is full or no candidate of the kind is left. Each round picks only
        what is still wanted; a round's candidates that may not be taken are passed over by the next."""
        while (want := self.max_tasks - len(self.grants)) > 0:
            picked = self._pick(reclaim=reclaim, want=want)
            if not picked:
                return
            contenders = []
            for task in picked:
                if getattr(task, "granted", False):  # claimed by the pick itself: no resources
                    check_transition(TaskState.READY, TaskState.CLAIMED, "claim")
                    self._grant(task, previous=None, ns=self.ns, fences={}, kept={}, key_writes=[])
                else:
                    contenders.append(task)
            if contenders:
                self._contend(contenders, reclaim=reclaim)
            if len(picked) < want:
                return

    def _filters(self) -> tuple[str, list[Any]]:
        sql, params = "", []
        if self.skip_held:
            sql += f" AND {statements.not_held('c')}"
            params += [False, _sql.prep(Task, "lease_expires_at", self.ns.now)]
        if self.node_ids:
            sql += f" AND c.node_id IN ({_sql.placeholders(self.node_ids)})"
            params += self.node_ids
        if self.passed_over:
            sql += f" AND c.task_id NOT IN ({_sql.placeholders(self.passed_over)})"
            params += self.passed_over
        return sql, params

    def _pick(self, *, reclaim: bool, want: int) -> list[Task]:
        extra, params = self._filters()
        ns = self.ns
        if not reclaim and _sql.is_postgres():
            lease = ns.now + timedelta(seconds=self.ttl_seconds)
            picked = _sql.load(
                Task,
                statements.pick_ready(extra=extra),
                [
                    ns.id,
                    TaskState.READY,
                    *params,
                    want,
                    TaskState.CLAIMED,
                    ns.scheduler_epoch,
                    self.owner_id,
                    _sql.prep(Task, "lease_expires_at", lease),
                    _sql.prep(Task, "updated_at", ns.now),
                ],
            )
            picked.sort(key=lambda t: (t.created_at, t.task_id))
            return picked
        state_params: list[Any] = [ns.id, TaskState.CLAIMED if reclaim else TaskState.READY]
        if reclaim:
            state_params += [_sql.prep(Task, "lease_expires_at", ns.now), ns.scheduler_epoch]
        return _sql.load(
            Task, statements.pick_candidates(reclaim=reclaim, extra=extra), [*state_params, *params, want]
        )

    def _contend(self, contenders: list[Task], *, reclaim: bool) -> None:
        """Claim the picked, locked, not yet claimed candidates that may be taken, in their order."""
        listing = [task for task in contenders if task.resources]
        keys = None
        if listing:
            # The first lock of keys may wait (one statement, key order, after the task rows: the documented
            # order). A later round already holds keys, so it skips the ones another transaction holds.
            first = self.keys is None
            keys = self.keys = (self.keys or KeysForClaims(self.ns)).lock(listing, skip_locked=not first)
        for task in contenders:
            ns = self.ns
            if task.resources:
                assert keys is not None
                if keys.held_against(task) is not None:
                    self.passed_over.append(task.task_id)
                    self.skip_held = True
                    continue
                ns = keys.ns  # the clock the holders were judged on
            check_transition(task.state, TaskState.CLAIMED, "reclaim" if reclaim else "claim")
            previous = _previous_claim(task, ns) if reclaim else None
            values = _claim_values(
                task, ns=ns, owner_id=self.owner_id, ttl_seconds=self.ttl_seconds, attempt_id=uuid.uuid4()
            )
            # We hold the row lock; the generation in the WHERE is a second guard, not the race's closer.
            updated = _sql.update(
                Task, {"task_id": task.pk, "claim_generation": task.claim_generation}, **values
            )
            assert updated == 1, "a locked row changed under us"
            _apply(task, values)
            fences, kept, key_writes = keys.take(task) if keys is not None else ({}, {}, [])
            self._grant(task, previous=previous, ns=ns, fences=fences, kept=kept, key_writes=key_writes)

    def _grant(
        self,
        task: Task,
        *,
        previous: dict[str, Any] | None,
        ns: NamespaceHold,
        fences: dict[str, int],
        kept: dict[str, Any],
        key_writes: list[_sql.Statement],
    ) -> None:
        writes, grant = _grant_writes(
            task, previous=previous, ns=ns, principal=self.principal, fences=fences, kept=kept
        )
        self.writes += key_writes + writes
        self.grants.append(grant)

    def send(self) -> None:
        """Every grant's attempts, events and key writes in one round trip."""
        if self.writes:
            _sql.together(*self.writes)
