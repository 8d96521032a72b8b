"""Stage and commit results (claim-v1.md §5), and releasing successors by a canonical commit."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef

from .. import clock, interleave
from ..errors import Fenced, Forbidden, Invalid, NotFound, NotStaged, StaleInput
from ..models import (
    AcceptancePoint,
    Attempt,
    AttemptEnd,
    EventKind,
    Principal,
    Resource,
    ResourceKey,
    StagedResult,
    Task,
    TaskDependency,
    TaskEvent,
    TaskState,
)
from ..states import check_transition
from . import _sql, statements, wakeups
from ._base import (
    NamespaceHold,
    event_statement,
    event_values,
    new_event,
)
from .authority import acceptance_point
from .resources import bump_revisions, check_commit_resources, lock_commit_resources


@dataclass(frozen=True)
class Staged:
    staged: StagedResult
    created: bool


@dataclass(frozen=True)
class Committed:
    result_commit_id: uuid.UUID
    unblocked: list[str]
    repeat: bool  # True: the stored answer to a commit that had already succeeded
    staged_result_id: uuid.UUID | None = None  # set when the result came inline (claim-v1.md §9)


_NO_RESULT: Any = object()


def _stage_row(
    *,
    principal: Principal,
    attempt: Attempt,
    task_id: str,
    claim_generation: int,
    result: Any,
    result_digest: str,
    now: Any,
) -> tuple[StagedResult, bool]:
    """Insert the attempt's staged row with its `result_staged` event, unless the attempt staged this digest
    already ((attempt, result_digest) is unique). The row (unsaved when nothing was inserted) and whether it was."""
    staged = StagedResult(
        staged_result_id=uuid.uuid4(),
        task_id=task_id,
        attempt_id=attempt.attempt_id,
        result=result,
        result_digest=result_digest,
        staged_at=now,
        canonical=False,
    )
    fields = {f.attname: getattr(staged, f.attname) for f in StagedResult._meta.concrete_fields}
    inserted = _sql.insert_if_absent_then(
        _sql.insert_statement(StagedResult, if_absent=True, **fields),
        TaskEvent,
        **event_values(
            EventKind.RESULT_STAGED,
            namespace_id=attempt.namespace_id,
            task_id=task_id,
            at=now,
            principal=principal,
            attempt_id=attempt.attempt_id,
            claim_generation=claim_generation,
            scheduler_epoch=attempt.scheduler_epoch,
            owner_id=attempt.owner_id,
            detail={"staged_result_id": str(staged.pk), "result_digest": result_digest},
        ),
    )
    return staged, inserted


def result_stage(
    *,
    principal: Principal,
    task_id: str,
    attempt_id: uuid.UUID,
    claim_generation: int,
    result: Any,
    result_digest: str,
) -> Staged:
    """Stage a result, isolated: never canonical, never visible as the task's result, never releases successors.

    Any attempt of the task may stage whatever the task's state (fenced, released, cancelled attempts too): staging
    grants nothing, the commit point decides. Staging the same digest again returns the existing record.
    The serializer has already checked that ``result_digest`` is the digest of ``result``.
    """
    with transaction.atomic(durable=True):
        # Staging grants nothing, so it takes no lock: the attempt row (and the clock) in one statement.
        attempt = _sql.select_one(Attempt, {"attempt_id": attempt_id, "task_id": task_id}, now=True)
        if attempt is None:
            if not Task.objects.filter(pk=task_id).exists():
                raise NotFound("no such task")
            raise Fenced("no such attempt of this task", reason="ATTEMPT", current={})
        if attempt.owner_id != principal.owner_id:
            raise Forbidden(f"attempt {attempt_id} is not {principal.owner_id!r}'s")
        if attempt.claim_generation != claim_generation:
            raise Fenced(
                f"attempt {attempt_id} holds claim_generation {attempt.claim_generation}, not {claim_generation}",
                reason="GENERATION",
                current={"claim_generation": attempt.claim_generation},
            )
        staged, inserted = _stage_row(
            principal=principal,
            attempt=attempt,
            task_id=task_id,
            claim_generation=claim_generation,
            result=result,
            result_digest=result_digest,
            now=clock.from_db(attempt.db_now),
        )
        if not inserted:
            staged = _sql.select_one(StagedResult, {"attempt_id": attempt_id, "result_digest": result_digest})
    return Staged(staged, created=inserted)


def task_commit(
    *,
    principal: Principal,
    task_id: str,
    attempt_id: uuid.UUID,
    scheduler_epoch: int,
    claim_generation: int,
    observed_cancel_generation: int,
    input_digest: str,
    result_digest: str,
    resources: list[dict[str, Any]] | None = None,
    result: Any = _NO_RESULT,
) -> Committed:
    """Make a staged result the task's one canonical result. Every check is made again here, at the commit
    point, in one transaction with the task row locked; earlier checks by the worker only save wasted work.

    0. A repeat of a commit that succeeded (same attempt and result_digest) returns the stored answer.
    1. CANCELLED: the task is cancelled, or observed_cancel_generation is not current.
    2. FENCED: EPOCH (the epoch rule), GENERATION, ATTEMPT (not the current attempt or not CLAIMED),
       LEASE_EXPIRED.
    3. STALE_INPUT: input_digest is not the current input's.
    4. STALE_INPUT (RESOURCE): a named resource's incarnation or revision is not what the worker read, or its
       incarnation or fence token is not what this attempt took at claim.
    5. NOT_STAGED: this attempt staged no result with this digest — unless ``result`` came inline (claim-v1.md §9):
       once 1–4 pass it is staged here, in this transaction (the same digest staged earlier by this attempt is
       reused, never a second row), so a refused commit stages nothing.
    Then: the staged row becomes canonical (a partial unique index allows one per task), the task COMMITTED,
    the attempt ends, and successors whose predecessors are now all committed become READY.
    """
    with acceptance_point(
        AcceptancePoint.COMMIT,
        principal=principal,
        task_id=task_id,
        attempt_id=attempt_id,
        claim_generation=claim_generation,
        scheduler_epoch=scheduler_epoch,
        owner_id=principal.owner_id,
    ) as at:
        task = at.task
        _check_resources_named(task, resources)
        at.resolve_attempt()
        if (
            task.state == TaskState.COMMITTED
            and task.attempt_id == attempt_id
            and task.result_digest == result_digest
        ):
            stored = StagedResult.objects.get(task_id=task_id, canonical=True)
            assert (
                stored.commit_id is not None
            )  # a canonical row carries its commit (staged_canonical_complete)
            return Committed(
                result_commit_id=stored.commit_id,
                unblocked=list(stored.unblocked or []),
                repeat=True,
                staged_result_id=stored.pk if result is not _NO_RESULT else None,
            )
        keys: dict[str, ResourceKey] = {}
        live: dict[str, Resource] = {}
        if task.resources:
            # Every lock this commit takes is taken before anything is decided — the task row, then the resource
            # keys (a claim of another task cannot take a newer token between our read and our write), then their
            # incarnations — and the lease is judged on the clock read after them, not before a wait on them.
            keys, live, db_now = lock_commit_resources(task.resources)
            at.after(db_now)
        at.require_not_cancelled(observed_cancel_generation)
        at.require_current_attempt(check_owner=False)
        at.require_live_lease(detail="the lease ran out before the commit")
        ns, current = at.ns, at.current
        if input_digest != task.input_digest:
            raise StaleInput("the input was revised: re-read it and compute again", current=current)
        incarnations = check_commit_resources(
            attempt_id=attempt_id, named=resources or [], locked=(keys, live), current=current
        )
        if result is not _NO_RESULT:
            attempt = Attempt(
                attempt_id=attempt_id,
                namespace_id=ns.id,
                scheduler_epoch=at.granted_epoch if at.granted_epoch is not None else ns.scheduler_epoch,
                owner_id=task.owner_id or "",
            )
            _stage_row(
                principal=principal,
                attempt=attempt,
                task_id=task_id,
                claim_generation=claim_generation,
                result=result,
                result_digest=result_digest,
                now=ns.now,
            )
        # Check 5 and the canonical flip in one statement: the staged row becomes canonical, or there is none.
        # The partial unique index one_canonical_commit_per_task is what makes a second canonical row impossible.
        commit_id = uuid.uuid4()
        flipped = list(
            _sql.load(
                StagedResult,
                statements.make_canonical(),
                [
                    True,
                    _sql.prep(StagedResult, "commit_id", commit_id),
                    _sql.prep(StagedResult, "committed_at", ns.now),
                    _sql.prep(StagedResult, "unblocked", []),
                    _sql.prep(StagedResult, "attempt_id", attempt_id),
                    result_digest,
                ],
            )
        )
        if not flipped:
            raise NotStaged("this attempt staged no result with this digest", current=current)
        check_transition(task.state, TaskState.COMMITTED, "commit")
        interleave.reach("task_commit.checked")

        task.state = TaskState.COMMITTED
        task.state_version += 1
        task.result_commit_id = commit_id
        task.result_digest = result_digest
        task.result = flipped[0].result
        task.lease_expires_at = None
        task.updated_at = ns.now
        writes = [
            _sql.update_statement(
                Task,
                {"task_id": task_id},
                state=task.state,
                state_version=task.state_version,
                result_commit_id=commit_id,
                result_digest=result_digest,
                result=task.result,
                lease_expires_at=None,
                updated_at=ns.now,
            ),
            _sql.update_statement(
                Attempt, {"attempt_id": attempt_id}, ended_at=ns.now, end_reason=AttemptEnd.COMMITTED
            ),
        ]
        unblocked: list[str] = []
        if task.has_successors:
            # The successor check must see this task COMMITTED: write it first.
            _sql.together(*writes)
            writes = []
            unblocked = _unblock_successors(task, ns=ns, principal=principal)
            if unblocked:  # part of the stored answer a repeat of this commit returns
                writes.append(
                    _sql.update_statement(
                        StagedResult, {"staged_result_id": flipped[0].pk}, unblocked=unblocked
                    )
                )
        writes.append(
            event_statement(
                EventKind.RESULT_COMMITTED,
                namespace_id=ns.id,
                task_id=task_id,
                at=ns.now,
                principal=principal,
                attempt_id=attempt_id,
                claim_generation=claim_generation,
                scheduler_epoch=ns.scheduler_epoch,
                owner_id=task.owner_id,
                point=AcceptancePoint.COMMIT,
                detail={
                    "result_commit_id": str(commit_id),
                    "result_digest": result_digest,
                    "unblocked": unblocked,
                },
            )
        )
        _sql.together(*writes)
        bump_revisions(incarnations)  # each resource named gets revision + 1, in the commit's transaction
    return Committed(
        result_commit_id=commit_id,
        unblocked=unblocked,
        repeat=False,
        staged_result_id=flipped[0].pk if result is not _NO_RESULT else None,
    )


def _check_resources_named(task: Task, resources: list[dict[str, Any]] | None) -> None:
    """A commit names exactly the resources the task lists, each once: it can neither skip one it holds nor
    write one it does not (400)."""
    named = [item["resource_key"] for item in resources or []]
    if len(named) != len(set(named)) or sorted(named) != sorted(task.resources):
        raise Invalid(
            {"resources": [f"must name exactly the task's resources, each once: {sorted(task.resources)}"]}
        )


def _unblock_successors(task: Task, *, ns: NamespaceHold, principal: Principal) -> list[str]:
    """Successors of ``task`` (now COMMITTED in this transaction) whose predecessors are all committed become
    READY. Only a canonical commit reaches here, so staged and fenced results never release a successor.

    The BLOCKED successors are locked first (in key order, so two committers never deadlock): when two
    predecessors of one task commit at once, the second waits on the first's lock and then — a new statement
    in READ COMMITTED — sees the first's commit, so one of them always releases the successor.
    """
    with connection.cursor() as cursor:
        cursor.execute(statements.lock_blocked_successors(), [task.pk, TaskState.BLOCKED])
        waiting = [row[0] for row in cursor.fetchall()]
    if not waiting:
        return []
    open_predecessor = TaskDependency.objects.filter(task_id=OuterRef("pk")).exclude(
        depends_on__state=TaskState.COMMITTED
    )
    ready = list(
        Task.objects.filter(pk__in=waiting)
        .exclude(Exists(open_predecessor))
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    if not ready:
        return []
    check_transition(TaskState.BLOCKED, TaskState.READY, "unblock")
    Task.objects.filter(pk__in=ready, state=TaskState.BLOCKED).update(
        state=TaskState.READY, state_version=F("state_version") + 1, updated_at=ns.now
    )
    wakeups.claimable(ns.name, len(ready))
    TaskEvent.objects.bulk_create(
        [
            new_event(
                EventKind.UNBLOCKED,
                namespace_id=ns.id,
                task_id=successor,
                at=ns.now,
                principal=principal,
                detail={"by": task.pk, "result_commit_id": str(task.result_commit_id)},
            )
            for successor in ready
        ]
    )
    return ready
