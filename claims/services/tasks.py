"""Creating tasks and the operator's changes to them: cancel, requeue, revise input."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connection, transaction

from .. import interleave
from ..digest import digest
from ..errors import (
    Invalid,
    InvalidTransition,
    NotCancellable,
    NotClaimable,
    NotFound,
    NotRevisable,
    TaskExists,
)
from ..models import (
    Attempt,
    AttemptEnd,
    EventKind,
    Principal,
    ReplayPolicy,
    Role,
    Task,
    TaskDependency,
    TaskEvent,
    TaskResource,
    TaskState,
)
from ..states import check_transition
from ..validation import all_of, real_text
from . import _sql, fair_share, statements, wakeups
from ._base import (
    NamespaceHold,
    append_event,
    event_values,
    hold_namespace,
    hold_task,
    task_current,
    task_let_go,
)
from .resources import resources_exist


@dataclass(frozen=True)
class TaskCreated:
    task: Task
    created: bool  # False: an idempotent repeat of an identical create


def _predecessor_states(ids: list[str], namespace_id: int, *, lock: str = "FOR SHARE") -> dict[str, str]:
    """The predecessors' states, each row locked (in key order) until this transaction ends.

    Closes the race where a predecessor's commit runs while this transaction decides BLOCKED: the commit holds
    the predecessor row FOR NO KEY UPDATE, so we wait for it and then read COMMITTED; a commit that starts after
    us waits for us and then finds this task among the successors it unblocks.
    """
    if not ids:
        return {}
    rows = Task.objects.filter(pk__in=ids, namespace_id=namespace_id).order_by("pk")
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(statements.lock_predecessor_states(len(ids), lock), [*ids, namespace_id])
            return dict(cursor.fetchall())
    return dict(rows.values_list("pk", "state"))


def _existing(existing: Task, definition: dict[str, Any], ns: Any) -> TaskCreated:
    """An existing task_id: the same definition is an idempotent repeat (200); anything else TASK_EXISTS."""
    same = (
        existing.namespace_id == definition["namespace_id"]
        and existing.node_id == definition["node_id"]
        and existing.input_digest == definition["input_digest"]
        and sorted(existing.depends_on) == definition["depends_on"]
        and existing.replay_policy == definition["replay_policy"]
        and sorted(existing.resources) == definition["resources"]
        and existing.fairness_key == definition["fairness_key"]
    )
    if same:
        return TaskCreated(existing, created=False)
    raise TaskExists(f"task {existing.pk} exists with another definition", current=task_current(existing, ns))


def task_create(
    *,
    principal: Principal,
    node_id: str,
    input: Any,
    task_id: str | None = None,
    namespace: str = "default",
    depends_on: list[str] | None = None,
    replay_policy: str = ReplayPolicy.REPLAYABLE,
    resources: list[str] | None = None,
    priority: int = fair_share.DEFAULT_PRIORITY,
    fairness_key: str = "",
    fairness_weight: float | None = None,
) -> TaskCreated:
    """Create a task READY, or BLOCKED while a predecessor is uncommitted. Idempotent on identical input.

    1. Hold the namespace (unknown: 400 — it is a field of the body).
    2. An existing task_id: the same definition is a repeat (200), anything else TASK_EXISTS. The fairness key is
       part of the definition; the priority and weight are not (an operator may have changed the priority since).
    3. Predecessors must exist in the namespace (400 otherwise); their states decide READY or BLOCKED.
    4. Its place in the grant order is stamped (``fair_share.stamp``): the key's lane at its priority is locked
       after everything above was read, and the task row is written last.
    """
    depends_on = list(dict.fromkeys(depends_on or []))
    resources = list(dict.fromkeys(resources or []))
    input_digest = digest(input)
    task_id = task_id or str(uuid.uuid4())
    with transaction.atomic(durable=True):
        try:
            ns = hold_namespace(name=namespace)
        except NotFound:  # a name in the body is a field error, not a missing resource
            raise Invalid({"namespace": [f"unknown namespace {namespace!r}"]}) from None
        definition = _definition(
            ns, node_id, input_digest, depends_on, replay_policy, resources, fairness_key
        )
        existing = Task.objects.filter(pk=task_id).first()
        if existing is not None:
            return _existing(existing, definition, ns)
        interleave.reach("task_create.checked")
        states = _checked_predecessors(task_id, depends_on, resources, ns)
        blocked = any(state != TaskState.COMMITTED for state in states.values())
        place = fair_share.stamp(ns, priority=priority, key=fairness_key, weight=fairness_weight)
        task = Task(
            task_id=task_id,
            namespace_id=ns.id,
            node_id=node_id,
            input=input,
            input_digest=input_digest,
            depends_on=depends_on,
            replay_policy=replay_policy,
            resources=resources,
            has_resources=bool(resources),
            state=TaskState.BLOCKED if blocked else TaskState.READY,
            priority=priority,
            fairness_key=fairness_key,
            fairness_weight=place.weight,
            vtag=place.vtags[0],
            created_at=ns.now,
            updated_at=ns.now,
        )
        winner = _inserted(task)
        if winner is not None:
            return _existing(winner, definition, ns)
        _link(task, states)
        detail: dict[str, Any] = {"state": task.state, "node_id": node_id, "input_digest": input_digest}
        detail.update(depends_on=depends_on, priority=priority, fairness_key=fairness_key)
        append_event(EventKind.TASK_CREATED, **ns.on(task.task_id, principal, detail=detail))
        if principal.role != Role.WORKER:
            ns.audit(principal, "task_create", target=task.task_id)
        if task.state == TaskState.READY:
            wakeups.claimable(ns.name, nodes=[node_id])
    return TaskCreated(task, created=True)


def tasks_adopt(
    *, principal: Principal, namespace: str, node_id: str, tasks: list[tuple[str, Any]]
) -> list[str]:
    """Tasks kept by another system (a team's legacy table) made claim.v1 tasks in bulk, READY, no predecessors, no
    resources: each ``(task_id, input)`` inserted unless its task_id exists already — then that task is left as it
    is, whatever it holds. One transaction: the namespace held FOR SHARE, one INSERT … ON CONFLICT DO NOTHING that
    returns the ids it inserted (so a task another request created meanwhile gets no second ``task_created``), then
    their events in one statement. Returns the ids created. An input of None (what a NULL column reads as) is
    adopted as ``{}``: a task's input is never null."""
    if not tasks:
        return []
    with transaction.atomic(durable=True):
        try:
            ns = hold_namespace(name=namespace)
        except NotFound:
            raise Invalid({"namespace": [f"unknown namespace {namespace!r}"]}) from None
        adopted = {task_id: {} if value is None else value for task_id, value in dict(tasks).items()}
        places = fair_share.stamp(
            ns, priority=fair_share.DEFAULT_PRIORITY, key="", weight=None, count=len(adopted)
        )
        rows: list[dict[str, Any]] = [
            {
                "task_id": task_id,
                "namespace_id": ns.id,
                "node_id": node_id,
                "input": value,
                "input_digest": digest(value),
                "depends_on": [],
                "replay_policy": ReplayPolicy.REPLAYABLE,
                "resources": [],
                "has_resources": False,
                "has_successors": False,
                "state": TaskState.READY,
                "state_version": 1,
                "scheduler_epoch": 0,
                "claim_generation": 0,
                "cancel_generation": 0,
                "priority": fair_share.DEFAULT_PRIORITY,
                "fairness_key": "",
                "fairness_weight": places.weight,
                "vtag": vtag,
                "created_at": ns.now,
                "updated_at": ns.now,
            }
            for (task_id, value), vtag in zip(adopted.items(), places.vtags, strict=True)
        ]
        sql, params = _sql.insert_many_statement(Task, rows)
        with connection.cursor() as cursor:
            cursor.execute(f"{sql} ON CONFLICT (task_id) DO NOTHING RETURNING task_id", params)
            created = [task_id for (task_id,) in cursor.fetchall()]
        if created:
            digests = {row["task_id"]: row["input_digest"] for row in rows}
            _sql.together(
                _sql.insert_many_statement(
                    TaskEvent,
                    [
                        event_values(
                            EventKind.TASK_CREATED,
                            namespace_id=ns.id,
                            task_id=task_id,
                            at=ns.now,
                            principal=principal,
                            detail={
                                "state": TaskState.READY,
                                "node_id": node_id,
                                "input_digest": digests[task_id],
                            },
                        )
                        for task_id in created
                    ],
                )
            )
            wakeups.claimable(ns.name, nodes=[node_id])
    return created


def _inserted(task: Task) -> Task | None:
    """Insert ``task``; None, or the task an identical create inserted first. The existence check before read
    without a lock: an identical create may have inserted the same task_id since. The primary key decides; the
    loser answers as a repeat would (or TASK_EXISTS)."""
    try:
        with transaction.atomic():
            task.save(force_insert=True)
    except IntegrityError:
        winner = Task.objects.filter(pk=task.task_id).first()
        if winner is None:  # not the primary key: some other constraint refused the row
            raise
        return winner
    return None


def _definition(
    ns: NamespaceHold,
    node_id: str,
    input_digest: str,
    depends_on: list[str],
    replay_policy: str,
    resources: list[str],
    fairness_key: str,
) -> dict[str, Any]:
    """What makes a create a repeat of an existing task rather than TASK_EXISTS."""
    return {
        "fairness_key": fairness_key,
        "namespace_id": ns.id,
        "node_id": node_id,
        "input_digest": input_digest,
        "depends_on": sorted(depends_on),
        "replay_policy": replay_policy,
        "resources": sorted(resources),
    }


def _checked_predecessors(
    task_id: str, depends_on: list[str], resources: list[str], ns: NamespaceHold
) -> dict[str, str]:
    """The predecessors' states, locked FOR NO KEY UPDATE (not FOR SHARE: the open ones are marked
    has_successors after) — or a 400 naming every field at fault: a task depending on itself, an unknown
    predecessor in the namespace, an unknown resource."""
    errors: dict[str, list[str]] = {}
    if task_id in depends_on:
        errors["depends_on"] = ["a task cannot depend on itself"]
    states = _predecessor_states(depends_on, ns.id, lock="FOR NO KEY UPDATE")
    unknown = [dep for dep in depends_on if dep not in states]
    if unknown:
        errors.setdefault("depends_on", []).append(
            f"unknown task(s) in namespace {ns.name!r}: {', '.join(unknown)}"
        )
    missing = resources_exist(resources)
    if missing:
        errors["resources"] = [f"unknown resource(s): {', '.join(missing)}"]
    if errors:
        raise Invalid(errors)
    return states


def _link(task: Task, states: dict[str, str]) -> None:
    """A created task's dependency and resource rows; its open predecessors marked has_successors."""
    TaskDependency.objects.bulk_create(
        [TaskDependency(task=task, depends_on_id=dep) for dep in task.depends_on]
    )
    TaskResource.objects.bulk_create([TaskResource(task=task, resource_key_id=key) for key in task.resources])
    open_predecessors = [dep for dep, state in states.items() if state != TaskState.COMMITTED]
    Task.objects.filter(pk__in=open_predecessors, has_successors=False).update(has_successors=True)


def _end_current_attempt(task: Task, *, reason: AttemptEnd, at) -> None:
    if task.attempt_id is not None:
        Attempt.objects.filter(pk=task.attempt_id, ended_at__isnull=True).update(
            ended_at=at, end_reason=reason
        )


def task_cancel(*, principal: Principal, task_id: str, reason: str) -> Task:
    """Cancel: cancel_generation+1, state CANCELLED, the current attempt ends. A commit is final
    (NOT_CANCELLABLE). Cancelling a cancelled task changes nothing and answers with the task as it is."""
    with transaction.atomic(durable=True):
        ns, task = hold_task(task_id)
        if task.state == TaskState.COMMITTED:
            raise NotCancellable("a committed task cannot be cancelled", current=task_current(task, ns))
        if task.state == TaskState.CANCELLED:
            return task
        check_transition(task.state, TaskState.CANCELLED, "cancel")
        interleave.reach("task_cancel.locked")
        ended = {
            "attempt_id": task.attempt_id,
            "claim_generation": task.claim_generation,
            "owner_id": task.owner_id,
        }
        _end_current_attempt(task, reason=AttemptEnd.CANCELLED, at=ns.now)
        if task.attempt_id is not None and task.resources:
            wakeups.keys_freed(task.resources)
        task.cancel_generation += 1
        task_let_go(task, TaskState.CANCELLED, ns.now, "cancel_generation")
        append_event(
            EventKind.CANCELLED,
            **ns.on(
                task_id,
                principal,
                attempt_id=ended["attempt_id"],
                claim_generation=ended["claim_generation"],
                owner_id=ended["owner_id"],
                detail={"reason": reason, "cancel_generation": task.cancel_generation},
            ),
        )
        ns.audit(principal, "task_cancel", target=task_id, reason=reason)
    return task


def task_requeue(*, principal: Principal, task_id: str) -> Task:
    """A CANCELLED task back to READY (BLOCKED while a predecessor is uncommitted). cancel_generation stays,
    so attempts from before the cancel stay cancelled."""
    with transaction.atomic(durable=True):
        ns, task = hold_task(task_id)
        if task.state != TaskState.CANCELLED:
            raise InvalidTransition("only a CANCELLED task can be requeued", current=task_current(task, ns))
        states = _predecessor_states(list(task.depends_on), ns.id)
        target = (
            TaskState.BLOCKED if any(s != TaskState.COMMITTED for s in states.values()) else TaskState.READY
        )
        check_transition(task.state, target, "requeue")
        task.state = target
        task.state_version += 1
        task.updated_at = ns.now
        task.save(update_fields=["state", "state_version", "updated_at"])
        append_event(EventKind.REQUEUED, **ns.on(task_id, principal, detail={"state": target}))
        ns.audit(principal, "task_requeue", target=task_id)
        if target == TaskState.READY:
            wakeups.claimable(ns.name, nodes=[task.node_id])
    return task


def task_revise_input(*, principal: Principal, task_id: str, input: Any) -> Task:
    """New input: new input_digest, state_version+1. A claim in flight stays; its commit with the old digest
    gets STALE_INPUT. Revising to the identical input changes nothing (no version bump, no stale claims)."""
    new_digest = digest(input)
    with transaction.atomic(durable=True):
        ns, task = hold_task(task_id)
        if task.state in (TaskState.COMMITTED, TaskState.CANCELLED):
            raise NotRevisable(f"a {task.state} task's input cannot change", current=task_current(task, ns))
        if task.input_digest == new_digest:
            return task
        previous = task.input_digest
        task.input = input
        task.input_digest = new_digest
        task.state_version += 1
        task.updated_at = ns.now
        task.save(update_fields=["input", "input_digest", "state_version", "updated_at"])
        append_event(
            EventKind.INPUT_REVISED,
            **ns.on(
                task_id,
                principal,
                detail={
                    "previous_digest": previous,
                    "input_digest": new_digest,
                    "state_version": task.state_version,
                },
            ),
        )
        ns.audit(principal, "task_revise_input", target=task_id, detail={"input_digest": new_digest})
    return task


def task_set_priority(*, principal: Principal, task_id: str, priority: int, reason: str) -> Task:
    """An operator's change of a task's priority (claim-v1.md §10), for its next grant: a holder is never
    interrupted. The task takes a new place in its key's lane at the new priority (``fair_share.stamp``), as if it
    joined that priority now. A committed or cancelled task: NOT_CLAIMABLE (STATE). The same priority again changes
    nothing. Recorded in the timeline and the audit log with the principal and the reason.

    Lock order: the task row and its namespace (``hold_task``), then the key and the lane (``stamp``)."""
    priority, reason = all_of(
        lambda: fair_share.checked_priority(priority),
        lambda: real_text(reason, why="A priority change needs a reason: it goes to the audit log."),
    )
    with transaction.atomic(durable=True):
        ns, task = hold_task(task_id)
        if task.state in (TaskState.COMMITTED, TaskState.CANCELLED):
            raise NotClaimable(
                f"a {task.state} task is never granted again", reason="STATE", current=task_current(task, ns)
            )
        if task.priority == priority:
            return task
        interleave.reach("task_set_priority.locked")
        previous = task.priority
        place = fair_share.stamp(ns, priority=priority, key=task.fairness_key, weight=None)
        task.priority, task.vtag, task.fairness_weight = priority, place.vtags[0], place.weight
        task.updated_at = ns.now
        task.save(update_fields=["priority", "vtag", "fairness_weight", "updated_at"])
        detail = {"from": previous, "to": priority, "reason": reason}
        append_event(EventKind.PRIORITY_CHANGED, **ns.on(task_id, principal, detail=detail))
        ns.audit(principal, "task_set_priority", target=task_id, reason=reason, detail=detail)
        if task.state == TaskState.READY:
            wakeups.claimable(ns.name, nodes=[task.node_id])
    return task
