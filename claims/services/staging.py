"""Staging a result (claim-v1.md §5): isolated — never canonical, never the task's result, never releasing a
successor; the commit point decides (``committing``)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from .. import clock
from ..errors import Fenced, Forbidden, NotFound
from ..models import Attempt, EventKind, Principal, StagedResult, Task, TaskEvent
from . import _sql
from ._base import event_values


@dataclass(frozen=True)
class Staged:
    staged: StagedResult
    created: bool


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
        **staged_event(principal, attempt, staged, claim_generation),
    )
    return staged, inserted


def staged_event(
    principal: Principal, attempt: Attempt, staged: StagedResult, claim_generation: int
) -> dict[str, Any]:
    return event_values(
        EventKind.RESULT_STAGED,
        namespace_id=attempt.namespace_id,
        task_id=staged.task_id,
        at=staged.staged_at,
        principal=principal,
        attempt_id=attempt.attempt_id,
        claim_generation=claim_generation,
        scheduler_epoch=attempt.scheduler_epoch,
        owner_id=attempt.owner_id,
        detail={"staged_result_id": str(staged.pk), "result_digest": staged.result_digest},
    )


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
