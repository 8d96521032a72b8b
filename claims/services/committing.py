"""Committing a result (claim-v1.md §5): what a commit is judged on and what it writes — its checks in the
contract's order, the canonical flip, the task and attempt rows, the `result_committed` event, successors released
— and the single commit (``task_commit``) made of them. The batch commit (``commit_many``) is made of the same
parts, under locks of its own."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import Exists, F, OuterRef

from .. import interleave
from ..errors import Invalid, NotStaged, StaleInput
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
from ._base import NamespaceHold, event_values, new_event, settle
from .authority import Acceptance, Named, acceptance_point
from .resources import bump_revisions, check_commit_resources, lock_commit_resources
from .staging import staged_event


@dataclass(frozen=True)
class Committed:
    result_commit_id: uuid.UUID
    unblocked: list[str]
    repeat: bool  # True: the stored answer to a commit that had already succeeded
    staged_result_id: uuid.UUID | None = None  # set when the result came inline (claim-v1.md §9)
    result: Any = None  # the canonical result and its digest, for a wrapping app's records (``Guard.settle``)
    result_digest: str = ""


NO_RESULT: Any = object()  # a commit without an inline result: it commits the one staged earlier


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
    result: Any = NO_RESULT,
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
    named = Named(attempt_id, claim_generation, scheduler_epoch, principal.owner_id)
    with acceptance_point(AcceptancePoint.COMMIT, principal=principal, task_id=task_id, named=named) as at:
        task = at.task
        check_resources_named(task, resources)
        at.resolve_attempt()
        repeat = repeated_answer(task, attempt_id, result_digest, inline=result is not NO_RESULT)
        if repeat is not None:
            settle(AcceptancePoint.COMMIT, at.ns, repeat)
            return repeat
        keys: dict[str, ResourceKey] = {}
        live: dict[str, Resource] = {}
        if task.resources:
            # Every lock this commit takes is taken before anything is decided — the task row, then the resource
            # keys (a claim of another task cannot take a newer token between our read and our write), then their
            # incarnations — and the lease is judged on the clock read after them, not before a wait on them.
            keys, live, db_now = lock_commit_resources(task.resources)
            at.after(db_now)
        judge(at, observed_cancel_generation=observed_cancel_generation, input_digest=input_digest)
        incarnations = check_commit_resources(
            attempt_id=attempt_id, named=resources or [], locked=(keys, live), current=at.current
        )
        (flipped,), events = flip_all([(at, result, result_digest)])
        if flipped is None:
            raise NotStaged("this attempt staged no result with this digest", current=at.current)
        interleave.reach("task_commit.checked")
        wakeups.keys_freed(task.resources)  # the attempt's keys are free for the tasks that list them
        writes = commit_writes(at, flipped)
        unblocked: list[str] = []
        if task.has_successors:
            # The successor check must see this task COMMITTED: write it first.
            _sql.together(*writes)
            writes = []
            unblocked = unblock_successors(task, ns=at.ns, principal=principal)
            if unblocked:  # part of the stored answer a repeat of this commit returns
                writes.append(
                    _sql.update_statement(StagedResult, {"staged_result_id": flipped.pk}, unblocked=unblocked)
                )
        events.append(committed_event(at, flipped, unblocked))
        _sql.together(*writes, _sql.insert_many_statement(TaskEvent, events))
        bump_revisions(incarnations)  # each resource named gets revision + 1, in the commit's transaction
        committed = committed_answer(flipped, unblocked, inline=result is not NO_RESULT)
        settle(AcceptancePoint.COMMIT, at.ns, committed)
    return committed


def repeats(task: Task, attempt_id: uuid.UUID, result_digest: str) -> bool:
    """Check 0: this attempt already committed this digest."""
    return (
        task.state == TaskState.COMMITTED
        and task.attempt_id == attempt_id
        and task.result_digest == result_digest
    )


def repeated_answer(
    task: Task, attempt_id: uuid.UUID, result_digest: str, *, inline: bool
) -> Committed | None:
    """Check 0's answer: the stored one, when this attempt already committed this digest."""
    if not repeats(task, attempt_id, result_digest):
        return None
    stored = StagedResult.objects.get(task_id=task.pk, canonical=True)
    assert stored.commit_id is not None  # a canonical row carries its commit (staged_canonical_complete)
    return Committed(
        result_commit_id=stored.commit_id,
        unblocked=list(stored.unblocked or []),
        repeat=True,
        staged_result_id=stored.pk if inline else None,
        result=stored.result,
        result_digest=stored.result_digest,
    )


def judge(at: Acceptance, *, observed_cancel_generation: int, input_digest: str) -> None:
    """Checks 1–3, on the task as locked and the clock read after every lock."""
    at.require_not_cancelled(observed_cancel_generation)
    at.require_current_attempt(check_owner=False)
    at.require_live_lease(detail="the lease ran out before the commit")
    if input_digest != at.task.input_digest:
        raise StaleInput("the input was revised: re-read it and compute again", current=at.current)


def flip_all(
    commits: list[tuple[Acceptance, Any, str]],
) -> tuple[list[StagedResult | None], list[dict[str, Any]]]:
    """Check 5 and the canonical flip, for commits (each its acceptance, its inline result or ``NO_RESULT``, and
    its result_digest) whose checks 0–4 passed: each one's staged row, now canonical, or None (NOT_STAGED).

    Inline results (claim-v1.md §9) are staged here, canonical as they are written, all in one upsert: a row the
    attempt staged earlier with the same digest is the one flipped, never a second row. Their `result_staged`
    events, for the rows actually inserted, come back to be written with the commit's own writes. A result staged
    earlier is flipped by one statement, which finds it or not. The partial unique index
    one_canonical_commit_per_task is what makes a second canonical row for a task impossible."""
    flipped: list[StagedResult | None] = [None] * len(commits)
    events: list[dict[str, Any]] = []
    fresh: dict[Any, tuple[StagedResult, Acceptance]] = {}
    for at, result, result_digest in commits:
        if result is not NO_RESULT:
            fresh[at.attempt_id] = (
                StagedResult(
                    staged_result_id=uuid.uuid4(),
                    task_id=at.task.pk,
                    attempt_id=at.attempt_id,
                    result=result,
                    result_digest=result_digest,
                    staged_at=at.ns.now,
                    canonical=True,
                    commit_id=uuid.uuid4(),
                    committed_at=at.ns.now,
                    unblocked=[],
                ),
                at,
            )
    written: dict[Any, StagedResult] = {}
    if fresh:
        rows = [
            {f.attname: getattr(staged, f.attname) for f in StagedResult._meta.concrete_fields}
            for staged, _ in fresh.values()
        ]
        update = ("canonical", "commit_id", "committed_at", "unblocked")
        written = {
            row.attempt_id: row
            for row in _sql.upsert(
                StagedResult, rows, conflict=("attempt_id", "result_digest"), update=update
            )
        }
    for position, (at, result, result_digest) in enumerate(commits):
        if result is not NO_RESULT:
            row = written[at.attempt_id]
            staged, _ = fresh[at.attempt_id]
            if row.pk == staged.pk:  # inserted, not an earlier row flipped
                attempt = Attempt(
                    attempt_id=at.attempt_id,
                    namespace_id=at.ns.id,
                    scheduler_epoch=at.granted_epoch
                    if at.granted_epoch is not None
                    else at.ns.scheduler_epoch,
                    owner_id=at.task.owner_id or "",
                )
                events.append(staged_event(at.principal, attempt, staged, at.claim_generation or 0))
            flipped[position] = row
            continue
        found = _sql.load(
            StagedResult,
            statements.make_canonical(),
            [
                True,
                _sql.prep(StagedResult, "commit_id", uuid.uuid4()),
                _sql.prep(StagedResult, "committed_at", at.ns.now),
                _sql.prep(StagedResult, "unblocked", []),
                _sql.prep(StagedResult, "attempt_id", at.attempt_id),
                result_digest,
            ],
        )
        flipped[position] = found[0] if found else None
    return flipped, events


def commit_writes(at: Acceptance, flipped: StagedResult) -> list[_sql.Statement]:
    """The task COMMITTED with the canonical result, and its attempt ended."""
    task, ns = at.task, at.ns
    check_transition(task.state, TaskState.COMMITTED, "commit")
    task.state = TaskState.COMMITTED
    task.state_version += 1
    task.result_commit_id = flipped.commit_id
    task.result_digest = flipped.result_digest
    task.result = flipped.result
    task.lease_expires_at = None
    task.updated_at = ns.now
    return [
        _sql.update_statement(
            Task,
            {"task_id": task.pk},
            state=task.state,
            state_version=task.state_version,
            result_commit_id=task.result_commit_id,
            result_digest=task.result_digest,
            result=task.result,
            lease_expires_at=None,
            updated_at=ns.now,
        ),
        _sql.update_statement(
            Attempt, {"attempt_id": at.attempt_id}, ended_at=ns.now, end_reason=AttemptEnd.COMMITTED
        ),
    ]


def committed_event(at: Acceptance, flipped: StagedResult, unblocked: list[str]) -> dict[str, Any]:
    detail = {"result_commit_id": str(flipped.commit_id), "result_digest": flipped.result_digest}
    return event_values(
        EventKind.RESULT_COMMITTED, **at.event_fields(holder=True, detail={**detail, "unblocked": unblocked})
    )


def committed_answer(flipped: StagedResult, unblocked: list[str], *, inline: bool) -> Committed:
    assert flipped.commit_id is not None
    return Committed(
        result_commit_id=flipped.commit_id,
        unblocked=unblocked,
        repeat=False,
        staged_result_id=flipped.pk if inline else None,
        result=flipped.result,
        result_digest=flipped.result_digest,
    )


def check_resources_named(task: Task, resources: list[dict[str, Any]] | None) -> None:
    """A commit names exactly the resources the task lists, each once: it can neither skip one it holds nor
    write one it does not (400)."""
    named = [item["resource_key"] for item in resources or []]
    if len(named) != len(set(named)) or sorted(named) != sorted(task.resources):
        raise Invalid(
            {"resources": [f"must name exactly the task's resources, each once: {sorted(task.resources)}"]}
        )


def unblock_successors(task: Task, *, ns: NamespaceHold, principal: Principal) -> list[str]:
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
    ready_nodes = list(
        Task.objects.filter(pk__in=waiting)
        .exclude(Exists(open_predecessor))
        .order_by("pk")
        .values_list("pk", "node_id")
    )
    if not ready_nodes:
        return []
    ready = [task_id for task_id, _ in ready_nodes]
    check_transition(TaskState.BLOCKED, TaskState.READY, "unblock")
    Task.objects.filter(pk__in=ready, state=TaskState.BLOCKED).update(
        state=TaskState.READY, state_version=F("state_version") + 1, updated_at=ns.now
    )
    wakeups.claimable(ns.name, len(ready), nodes=[node for _, node in ready_nodes])
    TaskEvent.objects.bulk_create(
        [
            new_event(
                EventKind.UNBLOCKED,
                **ns.on(
                    successor,
                    principal,
                    detail={"by": task.pk, "result_commit_id": str(task.result_commit_id)},
                ),
            )
            for successor in ready
        ]
    )
    return ready
