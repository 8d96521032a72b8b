"""Where legacy decides (SHADOW, V1_READS): legacy's decision on the tasks of a routed request, appended to its
history and compared with claim.v1's verdict — inside the claim.v1 decision's transaction (the routing's stage
hook), or in a transaction of its own (``legacy_decides``) where claim.v1 refused or the legacy API asked. And the
one rule of every stage: which requests are claim.v1's alone (``claim_v1_alone``), never put to legacy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import transaction
from django.db.models import Exists, OuterRef

from claims import clock
from claims.errors import NotFound
from claims.models import Attempt, Namespace, Principal, StagedResult, Task

from ..legacy import LegacyVerdict, decide, legacy_store, legacy_unit
from ..selectors import rollout_state as state_of
from . import adoption
from .errors import LegacyRefused
from .inputs import ClaimInput, CommitInput, Input, ReleaseInput, RenewInput
from .operations import LEGACY, Ask, TaskOperation, V1Verdict, view
from .shadow import Records, compare, record_legacy
from .state import hold_for_decision
from .workers import refused_registrations

T = TypeVar("T")
TaskInput = (
    ClaimInput | RenewInput | ReleaseInput | CommitInput
)  # an input naming one task's attempt or claim


@dataclass(frozen=True)
class Routed:
    """Who decided, and the answer. ``value`` is the core's own (ClaimGrant, Task, Committed; None: claim-next
    found nothing) where claim.v1 decided; where legacy decided, ``fields`` is the answer: claim.v1's view of
    the task, ``decided_by: "legacy"`` and ``shadow: {verdict, reason, mismatch_id}``."""

    decided_by: str
    value: Any = None
    fields: dict[str, Any] | None = None
    legacy: LegacyVerdict | None = None  # legacy's verdict, where it decided

    @property
    def refused(self) -> bool:
        return self.legacy is not None and not self.legacy.accepted


@dataclass(frozen=True)
class Target:
    """A first read of where a task's request goes (outside any lock: chosen again under it)."""

    namespace: Namespace
    stage: str
    protocol_refused: bool = False


def legacy_decisions(each: TaskOperation, asks: list[Ask], records: Records) -> list[LegacyVerdict]:
    """Legacy's decisions on the tasks asked — at once where the store can (``legacy.decide``) — each recorded in
    its history, inside the caller's transaction (the legacy rows are the last locks it takes; the store reads its
    clock after them)."""
    verdicts = decide(legacy_store(), [each.asked(ask) for ask in asks]) if asks else []
    for ask, verdict in zip(asks, verdicts, strict=True):
        at = verdict.at or clock.now()
        record_legacy(ask.namespace, ask.task_id, each.name, ask.api, ask.owner_id, verdict, at, records)
    return verdicts


def legacy_decision(each: TaskOperation, ask: Ask, records: Records) -> LegacyVerdict:
    """Legacy's decision on one task, recorded in its history, inside the caller's transaction."""
    return legacy_decisions(each, [ask], records)[0]


def compared(
    each: TaskOperation,
    ask: Ask,
    verdict: LegacyVerdict,
    v1: V1Verdict,
    records: Records,
    *,
    same_result: bool = False,
    task: Task | None = None,
) -> Routed:
    """The comparison recorded, and the answer as legacy decided it: ``decided_by`` is ``legacy`` when it
    accepted, else its refusal word (raised by the caller once the transaction is over)."""
    mismatch = compare(ask, each, verdict, v1, same_result=same_result, records=records)
    fields = view(ask.task_id, v1, mismatch.id if mismatch else None, task)
    if verdict.accepted:
        fields = {"outcome": each.accepted, **fields, **each.extras(v1, verdict)}
    return Routed(LEGACY, v1.value, fields, legacy=verdict)


def legacy_refusal(decided: Routed) -> LegacyRefused:
    verdict = decided.legacy
    assert verdict is not None
    return LegacyRefused(
        verdict.word,
        f"legacy refused: {verdict.word}",
        current={"owner_id": verdict.owner_id, "expires_at": verdict.expires_at},
        extra=decided.fields,
    )


def namespace_of(task_id: str, principal: Principal) -> Target:
    """The task's namespace with its stage, and whether this worker's protocol was refused there — one query.
    A first read: the choice it makes is made again under the namespace's lock (``still_routed``)."""
    task = (
        Task.objects.select_related("namespace__rollout")
        .annotate(
            protocol_refused=Exists(
                refused_registrations(principal).filter(namespace=OuterRef("namespace__name"))
            )
        )
        .filter(pk=task_id)
        .first()
    )
    if task is None:
        if not adoption.sighted(task_id):  # proxy mode: a row of their table named for the first time
            raise NotFound("no such task")
        return namespace_of(task_id, principal)
    stage, _ = state_of(task.namespace)
    return Target(task.namespace, stage, protocol_refused=task.protocol_refused)


def still_routed(ns: Namespace, stage: str) -> bool:
    """Inside legacy's own transaction: the stage, epoch and pause the request was routed on are still the
    namespace's, read under its row lock (``state.hold_for_decision``) — else an advance, a rollback or a fence
    landed in between and the request goes through the routing again."""
    held = hold_for_decision(ns.id)
    return (held.stage, held.scheduler_epoch, held.claims_paused) == (
        stage,
        ns.scheduler_epoch,
        ns.claims_paused,
    )


def legacy_decides(
    each: TaskOperation,
    ask: Ask,
    target: Target,
    then: Callable[[LegacyVerdict, Records], T],
) -> T | None:
    """Legacy's decision on ``ask`` in a transaction of its own — the one place legacy decides outside a claim.v1
    decision's transaction — when the namespace is still as ``target`` read it (else None: the caller routes
    again). ``then`` runs on the verdict in the same transaction (the comparison, where claim.v1 judged first)."""
    with legacy_unit(), transaction.atomic(durable=True):
        if not still_routed(target.namespace, target.stage):
            return None
        records = Records()
        answer = then(legacy_decision(each, ask, records), records)
        records.send()
        return answer


def task_input(data: Input) -> TaskInput:
    assert isinstance(data, ClaimInput | RenewInput | ReleaseInput | CommitInput), data
    return data


def result_to_complete(each: TaskOperation, task_id: str, data: Input) -> tuple[bool, Any]:
    """A commit's result as legacy would complete with it — inline, or the attempt's staged one: (found, result)."""
    if not each.commits:
        return False, None
    assert isinstance(data, CommitInput), data
    if data.inline:
        return True, data.result
    staged = list(
        StagedResult.objects.filter(
            task_id=task_id, attempt_id=data.attempt_id, result_digest=data.result_digest
        ).values_list("result", flat=True)[:1]
    )
    return bool(staged), staged[0] if staged else None


def claim_v1_alone(
    each: TaskOperation, task_id: str, data: Input, epoch: int, paused: bool, result: tuple[bool, Any]
) -> bool:
    """Whether a request is claim.v1's to answer alone, in every stage: its carried epoch is old, it is a claim
    while claims are paused, the attempt it names is unknown or was granted before a fence, or it is a commit with
    nothing to complete with. ``epoch`` and ``paused``: the namespace's, as the caller read them."""
    named = task_input(data)
    if named.scheduler_epoch != epoch:
        return True
    if isinstance(named, ClaimInput):
        return paused
    granted = (
        Attempt.objects.filter(pk=named.attempt_id, task_id=task_id)
        .values_list("scheduler_epoch", flat=True)
        .first()
    )
    if granted is None or granted != epoch:
        return True
    return each.commits and not result[0]
