"""claim-v1.md §9's batch commit: the common items decided together, each by the single commit's own checks in its
order (``committing``), in one transaction."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.db import transaction

from .. import interleave
from ..errors import ClaimError, Conflict, NotFound, NotStaged
from ..models import AcceptancePoint, Principal, Task, TaskEvent
from . import _sql
from ._base import NamespaceHold, RejectionLog, hold_tasks, run_guard, settle
from .authority import Acceptance, Named
from .committing import (
    NO_RESULT,
    Committed,
    check_resources_named,
    commit_writes,
    committed_answer,
    committed_event,
    flip_all,
    judge,
    repeats,
)


def task_commit_many(
    *, principal: Principal, items: list[tuple[str, dict[str, Any]]]
) -> dict[int, Committed | ClaimError]:
    """claim-v1.md §9's commits, the common ones decided together: one transaction, every task row locked in one
    statement (task_id order) with its namespace, one clock read after all of those locks, then each item judged
    by ``task_commit``'s checks, in ``task_commit``'s order, on the rows as locked — and the accepted items'
    writes and the refused items' `fenced` events sent together. A refused item writes nothing of its own (every
    check comes before its first write), so it undoes none of the others.

    Answers by the item's index. Left out, for the caller to send one by one through ``task_commit``: a task with
    resources (their locks come after the task's, per task) or with successors (released after the task is
    written), a task named more than once (each sees the one before), and the repeat of a commit that succeeded.
    """
    counts = Counter(task_id for task_id, _ in items)
    answers: dict[int, Committed | ClaimError] = {}
    with transaction.atomic(durable=True):
        held = hold_tasks(sorted(counts))
        for ns in {ns.id: ns for ns, _ in held.values()}.values():
            run_guard(AcceptancePoint.COMMIT, ns)
        judged: list[tuple[int, Acceptance, dict[str, Any]]] = []
        for index, (task_id, data) in enumerate(items):
            if task_id not in held:
                answers[index] = NotFound("no such task")
                continue
            ns, task = held[task_id]
            if counts[task_id] > 1 or task.resources or task.has_successors:
                continue
            named = _named(principal, data).fields()
            at = Acceptance(principal=principal, ns=ns, task=task, **named, point=AcceptancePoint.COMMIT)
            try:
                check_resources_named(task, data.get("resources"))
                at.resolve_attempt()
                if repeats(task, data["attempt_id"], data["result_digest"]):
                    continue
                judge(
                    at,
                    observed_cancel_generation=data["observed_cancel_generation"],
                    input_digest=data["input_digest"],
                )
            except ClaimError as exc:
                answers[index] = exc
                continue
            judged.append((index, at, data))
        interleave.reach("task_commit_many.judged")
        flips, events = flip_all(
            [(at, data.get("result", NO_RESULT), data["result_digest"]) for _, at, data in judged]
        )
        writes: list[_sql.Statement] = []
        for (index, at, data), flipped in zip(judged, flips, strict=True):
            if flipped is None:
                answers[index] = NotStaged(
                    "this attempt staged no result with this digest", current=at.current
                )
                continue
            writes += commit_writes(at, flipped)
            events.append(committed_event(at, flipped, []))
            answers[index] = committed_answer(flipped, [], inline="result" in data)
        for index, (task_id, data) in enumerate(items):
            answer = answers.get(index)
            if isinstance(answer, Conflict) and task_id in held:
                ns = held[task_id][0]
                log = _commit_log(principal, task_id, data, ns)
                if log.records(answer):
                    events.append(log.event(answer, at=ns.now))
        if events:
            _sql.together(*writes, _sql.insert_many_statement(TaskEvent, events))
        for ns in {ns.id: ns for ns, _ in held.values()}.values():
            settle(AcceptancePoint.COMMIT, ns, _of_namespace(answers, items, held, ns))
    return answers


def _of_namespace(
    answers: dict[int, Committed | ClaimError],
    items: list[tuple[str, dict[str, Any]]],
    held: dict[str, tuple[NamespaceHold, Task]],
    ns: NamespaceHold,
) -> dict[int, Committed | ClaimError]:
    """The answers, by item index, to the items on tasks of ``ns``."""
    return {
        index: answer
        for index, answer in answers.items()
        if items[index][0] in held and held[items[index][0]][0].id == ns.id
    }


def _named(principal: Principal, data: dict[str, Any]) -> Named:
    """What an item names, as its single commit would (the owner is the caller)."""
    return Named(data["attempt_id"], data["claim_generation"], data["scheduler_epoch"], principal.owner_id)


def _commit_log(principal: Principal, task_id: str, data: dict[str, Any], ns: NamespaceHold) -> RejectionLog:
    log = RejectionLog(
        AcceptancePoint.COMMIT, principal=principal, task_id=task_id, **_named(principal, data).fields()
    )
    log.namespace_id = ns.id
    return log
