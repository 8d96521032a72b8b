"""Legacy decisions in another database whose commit was never seen: told COMMITTED or ABORTED from that table, and
claim.v1's shadow of an ABORTED grant undone (docs/adopting.md, "Two databases").

Where legacy decides (SHADOW, V1_READS) in a table of another database, our records of a decision commit first —
claim.v1's shadow attempt, legacy's history, the comparison and a ``LegacyDecision`` — and theirs second, its rows
locked until then (``rollout.legacy.LegacyUnit``). A process that dies between the two leaves a ``LegacyDecision``
without an outcome, and a decision that never happened in their table. This job finds them (older than a grace, so
as not to race the request that is about to mark its own), and asks their table:

- a later decision on the same task found the row as it was after this one — it saw this one's commit, or not;
- else the row itself, locked (FOR UPDATE waits out a commit still in flight), as this decision would have left it.

ABORTED: where legacy's grant never happened, claim.v1's shadow attempt for it is released — no claim.v1 attempt is
left holding a task legacy never granted. Other operations keep what claim.v1 decided (a heartbeat longer there, a
release or a commit made there); the worker, who got no answer, sends again.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings

from claims import clock
from claims import services as core
from claims.errors import ClaimError
from claims.models import Role, Task, TaskState

from ..legacy import legacy_store
from ..legacy_table import same_state
from ..models import LegacyDecision
from .operations import LEGACY_OPERATIONS

_BATCH = 500


def resolve_open(*, namespace: str | None = None) -> dict[str, int]:
    store = legacy_store()
    if not store.separate_database:
        return {"committed": 0, "aborted": 0}
    cutoff = clock.now() - timedelta(seconds=settings.LEGACY_DECISION_GRACE_SECONDS)
    open_ = LegacyDecision.objects.filter(resolved_at__isnull=True, created_at__lt=cutoff)
    if namespace is not None:
        open_ = open_.filter(namespace=namespace)
    counts = {"committed": 0, "aborted": 0}
    for decision in open_.order_by("id")[:_BATCH]:
        later = (
            LegacyDecision.objects.filter(task_id=decision.task_id, id__gt=decision.id).order_by("id").first()
        )
        found = later.found if later is not None else store.state_now(decision.task_id)  # type: ignore[attr-defined]
        if same_state(found, decision.expected):
            _resolve(decision, "COMMITTED", "")
            counts["committed"] += 1
        else:
            _resolve(decision, "ABORTED", _undo(decision))
            counts["aborted"] += 1
    return counts


def _resolve(decision: LegacyDecision, outcome: str, undone: str) -> None:
    LegacyDecision.objects.filter(pk=decision.pk, resolved_at__isnull=True).update(
        resolved_at=clock.now(), outcome=outcome, undone=undone
    )


def _undo(decision: LegacyDecision) -> str:
    """An ABORTED legacy grant: claim.v1's attempt for it, if it still holds the task, released."""
    asked = LEGACY_OPERATIONS.get(decision.operation)  # None: a write-through ("record", "restore")
    if asked is None or not asked.claims:
        return ""
    return release_held(decision.task_id, decision.owner_id)


def release_held(task_id: str, owner_id: str) -> str:
    """The task's current claim.v1 attempt, if ``owner_id`` holds it, released as that owner (via legacy): what was
    done, or "" when it holds nothing. The owner's principal is made if it has none (a worker only observed)."""
    task = Task.objects.filter(pk=task_id, state=TaskState.CLAIMED, owner_id=owner_id).first()
    if task is None or task.attempt_id is None:
        return ""
    owner = core.principal_ensure(name=owner_id, role=Role.WORKER)
    try:
        with core.acting_via("legacy"):
            core.task_release(
                principal=owner,
                task_id=task_id,
                attempt_id=task.attempt_id,
                claim_generation=task.claim_generation,
                owner_id=owner_id,
                scheduler_epoch=task.scheduler_epoch,
            )
    except ClaimError as exc:  # it moved on meanwhile (released, fenced, taken over): nothing left to undo
        return f"nothing: {exc}"[:200]
    return f"released claim.v1 attempt {task.attempt_id}"
