"""Shadow comparison: claim.v1's verdict on an operation legacy decided, set against legacy's, recorded.

Where legacy decides (SHADOW, V1_READS) every operation is judged by both stores. A disagreement becomes a
``Mismatch``, reason the first matching row of rollout.md's table; every comparison counts toward the
SHADOW → V1_READS gate (``ComparedOperation``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from django.db import transaction

from claims import clock
from claims.errors import ClaimError
from claims.models import Attempt, Task, TaskState

from ..legacy import LegacyVerdict, legacy_store
from ..models import (
    ComparedOperation,
    ExplainRule,
    LegacyClaim,
    LegacyEvent,
    Mismatch,
    MismatchReason,
    MismatchStatus,
)
from .operations import TaskOperation, V1Verdict, refused

__all__ = ["Records", "V1Verdict", "compare", "judged", "mismatch_reason", "record_legacy"]

_STALE_WORDS = {"FENCED", "CANCELLED", "STALE_INPUT"}
FENCE_NOTE = (
    "Explained automatically: an epoch fence ended this lease in claim.v1; legacy knows no epochs and keeps it "
    "until its own expiry. The disagreement is the fence's, not a bug of either store."
)


def judged(operation: Any, *, accepted_word: str) -> V1Verdict:
    """Run one claim.v1 service call and turn its answer into a verdict: a refusal is a verdict, not an error."""
    try:
        value = operation()
    except ClaimError as exc:
        return refused(exc)
    return accepted(value, accepted_word)


def accepted(value: Any, word: str) -> V1Verdict:
    """claim.v1's verdict on a decision it made: ``value`` is the service's answer."""
    attempt_id = getattr(value, "attempt_id", None)
    generation = getattr(getattr(value, "task", value), "claim_generation", None)
    return V1Verdict(
        True,
        word,
        attempt_id=str(attempt_id) if attempt_id else None,
        claim_generation=generation,
        value=value,
    )


@dataclass
class Records:
    """The rows one routed decision appends — legacy's history and the comparisons — kept until it settles, then
    sent in one statement per table (``send``), in the decision's transaction. A mismatch is written at once: its
    id is part of the answer."""

    events: list[LegacyEvent] = field(default_factory=list)
    compared: list[ComparedOperation] = field(default_factory=list)

    def send(self) -> None:
        if self.events:
            LegacyEvent.objects.bulk_create(self.events)
        if self.compared:
            ComparedOperation.objects.bulk_create(self.compared)
        self.events, self.compared = [], []


def record_legacy(
    namespace: str,
    task_id: str,
    operation: str,
    api: str,
    owner_id: str,
    verdict: LegacyVerdict,
    now: datetime,
    records: Records | None = None,
) -> None:
    """Append legacy's decision to the task's legacy history, in the decision's transaction (with ``records``:
    when they are sent)."""
    event = LegacyEvent(
        namespace=namespace,
        task_id=task_id,
        operation=operation,
        api=api,
        owner_id=owner_id,
        verdict=verdict.word,
        accepted=verdict.accepted,
        at=now,
    )
    if records is not None:
        records.events.append(event)
    else:
        event.save()


def _v1_live_other_owner(task_id: str, owner_id: str) -> bool:
    task = Task.objects.select_related("namespace").filter(pk=task_id).first()
    return bool(
        task
        and task.state == TaskState.CLAIMED
        and task.owner_id != owner_id
        and task.lease_expires_at is not None
        and task.lease_expires_at > clock.now()
        and task.scheduler_epoch == task.namespace.scheduler_epoch
    )


def _fence_unseen(operation: TaskOperation, legacy: LegacyVerdict, v1: V1Verdict, task_id: str) -> bool:
    if not operation.claims and not operation.commits:  # a renew (heartbeat) or a release
        return legacy.accepted and not v1.accepted and (v1.word, v1.reason) == ("FENCED", "EPOCH")
    if operation.claims and not legacy.accepted and legacy.word == "HELD" and v1.accepted and legacy.owner_id:
        held = (
            Attempt.objects.filter(task_id=task_id, owner_id=legacy.owner_id)
            .order_by("-claim_generation")
            .values_list("scheduler_epoch", flat=True)
            .first()
        )
        epoch = Task.objects.filter(pk=task_id).values_list("namespace__scheduler_epoch", flat=True).first()
        return held is not None and epoch is not None and held < epoch
    return False


class Subject(Protocol):
    """Whose operation both stores judged: an ``operations.Ask``, an observed change, or a winner read again."""

    @property
    def namespace(self) -> str: ...
    @property
    def task_id(self) -> str: ...
    @property
    def owner_id(self) -> str: ...
    @property
    def api(self) -> str: ...


@dataclass(frozen=True)
class Seen:
    """A ``Subject`` made of its fields."""

    namespace: str
    task_id: str
    owner_id: str
    api: str


def mismatch_reason(
    about: Subject,
    operation: TaskOperation,
    legacy: LegacyVerdict,
    v1: V1Verdict,
    *,
    same_result: bool = False,
    legacy_row: LegacyClaim | None = None,
) -> str | None:
    """The first row of rollout.md's table that matches, or None when the stores agree. ``legacy_row``: legacy's row
    as that decision left it, where the caller has it (observe mode reads it from the change); else the row now.
    Before those rows, the disagreements a fence causes by itself (``FENCE_UNSEEN_BY_LEGACY``): a claim legacy
    refused because the holder's lease is one a fence ended in claim.v1, and a heartbeat or release under such a
    lease that legacy accepted and claim.v1 refused for its epoch. (A complete under it stays STALE_COMMIT_ACCEPTED:
    the stale write the fence exists to stop.)"""
    if _fence_unseen(operation, legacy, v1, about.task_id):
        return MismatchReason.FENCE_UNSEEN_BY_LEGACY
    if operation.claims:
        if legacy.accepted and not v1.accepted and _v1_live_other_owner(about.task_id, about.owner_id):
            return MismatchReason.DOUBLE_GRANT
        if not legacy.accepted and legacy.word == "HELD" and v1.accepted:
            return MismatchReason.DOUBLE_GRANT
    if operation.commits and legacy.accepted and not v1.accepted and v1.word in _STALE_WORDS:
        return MismatchReason.STALE_COMMIT_ACCEPTED
    if legacy.accepted and not v1.accepted:
        return MismatchReason.V1_REJECTED_ONLY
    if not legacy.accepted and v1.accepted:
        return MismatchReason.LEGACY_REJECTED_ONLY
    if operation.commits and legacy.accepted and v1.accepted and not same_result:
        row = legacy_row if legacy_row is not None else legacy_store().get(task_id=about.task_id)
        canonical = Task.objects.filter(pk=about.task_id).values_list("result_digest", flat=True).first()
        if row is not None and canonical and row.result_digest != canonical:
            return MismatchReason.WINNER_DIFFERS
    return None


def record_direct_write(
    *, namespace: str, task_id: str, operation: str, owner_id: str, legacy: LegacyVerdict, at: Any
) -> Mismatch:
    """Observe mode, from V1_WRITES on: an old binary wrote the legacy table directly — a mismatch of its own
    (DIRECT_WRITE), open until reviewed, inside the caller's transaction."""
    return Mismatch.objects.create(
        namespace=namespace,
        task_id=task_id,
        operation=operation,
        api="legacy",
        legacy={"verdict": legacy.word, "owner_id": owner_id},
        v1={
            "verdict": None,
            "reason": "claim.v1 decides in this stage: the legacy table is written only by it",
        },
        reason=MismatchReason.DIRECT_WRITE,
        status=MismatchStatus.OPEN,
        at=at,
    )


def compare(
    about: Subject,
    operation: TaskOperation,
    legacy: LegacyVerdict,
    v1: V1Verdict,
    *,
    same_result: bool = False,
    records: Records | None = None,
    legacy_row: LegacyClaim | None = None,
) -> Mismatch | None:
    """Record the comparison (it counts toward the SHADOW → V1_READS gate) and, on disagreement, the mismatch —
    EXPLAINED at once when an explain rule covers its reason. Inside the caller's transaction when it has one
    (the routed decision's), else in its own. ``same_result``: the caller knows both stores completed with one
    result in one transaction, so the winners cannot differ and are not read again."""
    reason = mismatch_reason(about, operation, legacy, v1, same_result=same_result, legacy_row=legacy_row)
    namespace = about.namespace
    with transaction.atomic(savepoint=False):
        now = legacy.at or clock.now()
        compared = ComparedOperation(
            namespace=namespace, operation=operation.name, api=about.api, agreed=reason is None, at=now
        )
        if records is not None:
            records.compared.append(compared)
        else:
            compared.save()
        if reason is None:
            return None
        rule = ExplainRule.objects.filter(namespace=namespace, reason=reason).order_by("-id").first()
        review: dict[str, Any] = {"status": MismatchStatus.OPEN}
        if reason == MismatchReason.FENCE_UNSEEN_BY_LEGACY:  # the fence's own: explained as it is recorded
            review = {
                "status": MismatchStatus.EXPLAINED,
                "note": FENCE_NOTE,
                "reviewed_by": "claim control plane",
            }
        elif rule is not None:
            review = {"status": MismatchStatus.EXPLAINED, "note": rule.note, "explained_by_rule": rule}
        return Mismatch.objects.create(
            namespace=namespace,
            task_id=about.task_id,
            operation=operation.name,
            api=about.api,
            legacy={"verdict": legacy.word, "owner_id": legacy.owner_id or about.owner_id},
            v1=v1.as_record(),
            reason=reason,
            at=now,
            **review,
        )
