"""Claim-next and batch claims (claim-v1.md §4, §9, §10): the picks of a namespace's claimable tasks in grant order —
READY tasks and claims to take back — and their grants, in one transaction. A claim of a named task is
``claiming.task_claim``; both write a grant through ``claiming.grant_writes``."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import transaction

from ..errors import Invalid, NotFound
from ..models import AcceptancePoint, Principal, Task, TaskState
from ..states import check_transition
from . import _sql, claim_keys, statements
from ._base import NamespaceHold, RejectionLog, hold_namespace, run_guard, settle
from .authority import require_epoch_and_pause, require_owner
from .claiming import (
    ClaimGrant,
    apply_values,
    check_lease_seconds,
    claim_values,
    grant_writes,
    previous_claim,
)
from .resources import KeysForClaims


def task_claim_next(**request: Any) -> ClaimGrant | None:
    """Claim the first claimable task of a namespace in grant order, or None when nothing is claimable (the API's
    204): a batch of one — ``task_claim_batch``'s arguments but ``max_tasks``."""
    grants = task_claim_batch(max_tasks=1, **request)
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
        batch.fill()
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

    def fill(self) -> None:
        """Pick and grant until the batch is full or nothing is left that this request may take, in grant order
        (claim-v1.md §10) across READY tasks and claims to take back: a READY pick takes no lower priority than the
        best stale claim, and a stale pick none lower than the best READY task, so each pick serves the best
        priority there is. With no stale claim — the common path — one READY pick fills the batch. A READY pick
        that comes back short is followed by a stale pick; when that neither grants nor passes anything over,
        nothing else may be taken. (A stale claim passed over — its keys held — no longer bounds the READY pick,
        so the READY pick runs again.)"""
        while self._wanted() > 0:
            self._fill_kind(reclaim=False)
            if self._wanted() == 0 or not self._fill_kind(reclaim=True):
                return

    def _moved(self) -> tuple[int, int]:
        return len(self.grants), len(self.passed_over)

    def _wanted(self) -> int:
        return self.max_tasks - len(self.grants)

    def _fill_kind(self, *, reclaim: bool) -> bool:
        """Pick and grant until the batch is full or no candidate of the kind is left; whether any was granted or
        passed over. Each round picks only what is still wanted; a round's candidates that may not be taken are
        passed over by the next."""
        before = self._moved()
        while (want := self._wanted()) > 0:
            picked = self._pick(reclaim=reclaim, want=want)
            if not picked:
                break
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
                break
        return self._moved() != before

    def _filters(self, alias: str) -> tuple[str, list[Any]]:
        """What this request may take, as conditions on the task ``alias``: its node filter, the tasks it passed
        over, and — once it met one — no task whose resources another live attempt holds."""
        sql, params = "", []
        if self.skip_held:
            sql += f" AND {statements.not_held(alias)}"
            params += [False, _sql.prep(Task, "lease_expires_at", self.ns.now)]
        if self.node_ids:
            sql += f" AND {alias}.node_id IN ({_sql.placeholders(self.node_ids)})"
            params += self.node_ids
        if self.passed_over:
            sql += f" AND {alias}.task_id NOT IN ({_sql.placeholders(self.passed_over)})"
            params += self.passed_over
        return sql, params

    def _pick(self, *, reclaim: bool, want: int) -> list[Task]:
        extra, params = self._filters("c")
        bound, bound_params = self._filters("s")
        ns = self.ns
        stale = [ns.id, _sql.prep(Task, "lease_expires_at", ns.now), ns.scheduler_epoch, *bound_params]
        if not reclaim and _sql.is_postgres():
            lease = ns.now + timedelta(seconds=self.ttl_seconds)
            picked = _sql.load(
                Task,
                statements.pick_ready(extra=extra, bound=bound),
                [
                    ns.id,
                    TaskState.READY,
                    *params,
                    *stale,
                    want,
                    TaskState.CLAIMED,
                    ns.scheduler_epoch,
                    self.owner_id,
                    _sql.prep(Task, "lease_expires_at", lease),
                    _sql.prep(Task, "updated_at", ns.now),
                ],
            )
            picked.sort(key=lambda t: (t.priority, t.vtag, t.task_id))
            return picked
        state_params: list[Any] = [ns.id, TaskState.CLAIMED if reclaim else TaskState.READY]
        if reclaim:
            state_params += [_sql.prep(Task, "lease_expires_at", ns.now), ns.scheduler_epoch]
        other = [ns.id, TaskState.READY, *bound_params] if reclaim else stale
        return _sql.load(
            Task,
            statements.pick_candidates(reclaim=reclaim, extra=extra, bound=bound),
            [*state_params, *params, *other, want],
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
            previous = previous_claim(task, ns) if reclaim else None
            values = claim_values(
                task, ns=ns, owner_id=self.owner_id, ttl_seconds=self.ttl_seconds, attempt_id=uuid.uuid4()
            )
            # We hold the row lock; the generation in the WHERE is a second guard, not the race's closer.
            updated = _sql.update(
                Task, {"task_id": task.pk, "claim_generation": task.claim_generation}, **values
            )
            assert updated == 1, "a locked row changed under us"
            apply_values(task, values)
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
        writes, grant = grant_writes(
            task, previous=previous, ns=ns, principal=self.principal, fences=fences, kept=kept
        )
        self.writes += key_writes + writes
        self.grants.append(grant)

    def send(self) -> None:
        """Every grant's attempts, events and key writes in one round trip."""
        if self.writes:
            _sql.together(*self.writes)
