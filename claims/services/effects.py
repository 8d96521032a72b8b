"""The effect ledger (claim-v1.md §6): side effects that happen at most once although attempts run at least once.

An effect slot has one record, addressed by ``effect_id`` = sha256(task_id, node_id, slot) — the same for every
attempt of the task, never containing the attempt or the payload. The first PREPARED binds its payload digest
with a compare-and-set; a different payload is PAYLOAD_CONFLICT. Its ``effect_id`` is the idempotency key sent
downstream. A timeout is UNKNOWN, never FAILED: the target may have acted, so the next attempt reconciles
before it may call again.

Lock order everywhere: task row (with its namespace, ``hold_task``), then the effect row, then dispatch rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from .. import interleave
from ..digest import digest
from ..digest import effect_id as make_effect_id
from ..errors import (
    ApprovalRequired,
    Cancelled,
    Fenced,
    Forbidden,
    Invalid,
    InvalidTransition,
    NotFound,
    NotUnknown,
    PayloadConflict,
)
from ..models import (
    AcceptancePoint,
    Attempt,
    DispatchIntent,
    DispatchState,
    Effect,
    EffectEvent,
    EffectState,
    EventKind,
    Principal,
    ReplayPolicy,
    Role,
    Task,
    TaskState,
)
from ._base import NamespaceHold, RejectionLog, append_event, audit, hold_task, locked_rows, task_current
from .leases import check_authority, resolve_attempt
from .resources import check_dispatch_resources, lock_keys

E = EffectState

# A reported outcome moves the effect; anything else is INVALID_TRANSITION.
_OUTCOME_FROM = {E.PREPARED, E.UNKNOWN}
_EVENT_FOR_STATE = {
    E.COMMITTED: EventKind.EFFECT_COMMITTED,
    E.UNKNOWN: EventKind.EFFECT_UNKNOWN,
    E.FAILED: EventKind.EFFECT_FAILED,
}


@dataclass(frozen=True)
class Prepared:
    effect: Effect
    outcome: str  # PREPARED | RECONCILE_REQUIRED | ALREADY_COMMITTED | APPROVAL_REQUIRED
    created: bool


def effect_current(effect: Effect) -> dict[str, Any]:
    return {
        "effect_id": effect.effect_id,
        "state": effect.state,
        "bound_payload_digest": effect.payload_digest,
    }


def _history(
    effect: Effect,
    kind: str,
    *,
    at,
    principal: Principal | None,
    frm: str = "",
    to: str = "",
    attempt_id: Any = None,
    claim_generation: int | None = None,
    detail: dict | None = None,
) -> None:
    EffectEvent.objects.create(
        effect=effect,
        kind=kind,
        from_state=frm,
        to_state=to,
        at=at,
        attempt_id=attempt_id,
        claim_generation=claim_generation,
        principal=principal.name if principal else "",
        detail=detail or {},
    )


def _task_event(
    kind: EventKind,
    effect: Effect,
    ns: NamespaceHold,
    principal: Principal | None,
    *,
    attempt_id: Any = None,
    claim_generation: int | None = None,
    owner_id: str | None = None,
    point: bool = True,
    detail: dict | None = None,
) -> None:
    append_event(
        kind,
        namespace_id=ns.id,
        task_id=effect.task_id,
        at=ns.now,
        principal=principal,
        attempt_id=attempt_id,
        claim_generation=claim_generation,
        scheduler_epoch=ns.scheduler_epoch,
        owner_id=owner_id,
        point=AcceptancePoint.EFFECT if point else None,
        detail={
            "effect_id": effect.effect_id,
            "effect_slot": effect.effect_slot,
            "state": effect.state,
            **(detail or {}),
        },
    )


@dataclass(frozen=True)
class _Request:
    """Who is asking, as which attempt: what every worker call on an effect names."""

    principal: Principal
    attempt_id: Any
    claim_generation: int | None
    scheduler_epoch: int | None
    owner_id: str | None

    def authorise(self, task: Task, ns: NamespaceHold) -> None:
        effect_authority(
            task,
            ns,
            self.principal,
            attempt_id=self.attempt_id,
            claim_generation=self.claim_generation,
            scheduler_epoch=self.scheduler_epoch,
            owner_id=self.owner_id,
        )


@contextmanager
def _at_effect_point(
    request: _Request, task_id: str, *, effect_id: str | None = None, effect_slot: str = ""
) -> Iterator[tuple[NamespaceHold, Task, Effect | None]]:
    """One effect call: a request at the `effect` acceptance point (a refusal is logged as a `fenced` event), in
    one transaction holding, in the documented order, the task row with its namespace and then the effect row
    (named, or the slot's) — and the clock read after both. The caller authorises once every lock it needs is
    held, so authority is judged on what the locks keep still."""
    log = RejectionLog(
        AcceptancePoint.EFFECT,
        principal=request.principal,
        task_id=task_id,
        attempt_id=request.attempt_id,
        claim_generation=request.claim_generation,
        scheduler_epoch=request.scheduler_epoch,
        owner_id=request.owner_id,
    )
    with log, transaction.atomic(durable=True):
        ns, task = hold_task(task_id)
        log.namespace_id = ns.id
        eid = effect_id or make_effect_id(task.task_id, task.node_id, effect_slot)
        rows, db_now = locked_rows(Effect, "effect_id = %s", [eid], order="effect_id", lock="FOR UPDATE")
        yield ns.at(db_now), task, rows[0] if rows else None


def effect_authority(
    task: Task,
    ns: NamespaceHold,
    principal: Principal,
    *,
    attempt_id: uuid.UUID,
    claim_generation: int,
    scheduler_epoch: int,
    owner_id: str,
) -> None:
    """Authority for an effect call (§6): the attempt named is the task's current attempt, owned by the caller,
    not fenced by the epoch rule, its lease not expired, the task not cancelled. 403 before 409."""
    if owner_id != principal.owner_id:
        raise Forbidden(f"this token acts as {principal.owner_id!r}, not {owner_id!r}")
    granted_epoch = resolve_attempt(task, attempt_id, principal)
    current = task_current(task, ns)
    if task.state == TaskState.CANCELLED:
        raise Cancelled("the task was cancelled", current=current)
    check_authority(
        task,
        ns,
        attempt_id=attempt_id,
        claim_generation=claim_generation,
        scheduler_epoch=scheduler_epoch,
        granted_epoch=granted_epoch,
        owner_id=owner_id,
    )
    if task.lease_expires_at <= ns.now:
        raise Fenced("the lease ran out", reason="LEASE_EXPIRED", current=current)


def _lock_effect(effect_id: str) -> Effect | None:
    return Effect.objects.select_for_update().filter(pk=effect_id).first()


def _task_of(effect_id: str) -> str:
    task_id = Effect.objects.filter(pk=effect_id).values_list("task_id", flat=True).first()
    if task_id is None:
        raise NotFound("no such effect")
    return task_id


def effect_prepare(
    *,
    principal: Principal,
    task_id: str,
    effect_slot: str,
    payload_digest: str,
    attempt_id: uuid.UUID,
    claim_generation: int,
    scheduler_epoch: int,
    owner_id: str,
) -> Prepared:
    """Bind the slot's payload and say what the worker may do next.

    No record: create it PREPARED, bound to ``payload_digest`` (201). A record with another digest:
    PAYLOAD_CONFLICT. The same digest: PREPARED (go on), RECONCILE_REQUIRED (UNKNOWN: reconcile first),
    ALREADY_COMMITTED (make no call), or — after a definite FAILED — PREPARED again under the same key.
    A NON_REPLAYABLE task's effect answers APPROVAL_REQUIRED (202) until an operator approves it.
    """
    request = _Request(principal, attempt_id, claim_generation, scheduler_epoch, owner_id)
    with _at_effect_point(request, task_id, effect_slot=effect_slot) as (ns, task, effect):
        request.authorise(task, ns)
        eid = make_effect_id(task.task_id, task.node_id, effect_slot)
        created = effect is None
        if created:
            # The task row lock serialises every prepare of this task, so the insert cannot race another.
            effect = Effect.objects.create(
                effect_id=eid,
                task_id=task.task_id,
                namespace_id=ns.id,
                node_id=task.node_id,
                effect_slot=effect_slot,
                state=E.PREPARED,
                payload_digest=payload_digest,
                non_replayable=task.replay_policy == ReplayPolicy.NON_REPLAYABLE,
                created_at=ns.now,
                updated_at=ns.now,
            )
            _history(
                effect,
                "prepared",
                at=ns.now,
                principal=principal,
                to=E.PREPARED,
                attempt_id=attempt_id,
                claim_generation=claim_generation,
                detail={"payload_digest": payload_digest},
            )
        elif effect.payload_digest != payload_digest:
            raise PayloadConflict("this slot is bound to another payload", current=effect_current(effect))
        elif effect.state == E.FAILED:
            # A definite failure: the target did not act. Retry under the same key.
            _transition(
                effect,
                E.PREPARED,
                at=ns.now,
                principal=principal,
                kind="prepared",
                attempt_id=attempt_id,
                claim_generation=claim_generation,
            )
        else:
            _history(
                effect,
                "prepare_seen",
                at=ns.now,
                principal=principal,
                attempt_id=attempt_id,
                claim_generation=claim_generation,
                detail={"state": effect.state},
            )
        outcome = {E.PREPARED: "PREPARED", E.UNKNOWN: "RECONCILE_REQUIRED", E.COMMITTED: "ALREADY_COMMITTED"}[
            effect.state
        ]
        if outcome == "PREPARED" and effect.non_replayable and effect.approved_at is None:
            outcome = "APPROVAL_REQUIRED"
        _task_event(
            EventKind.EFFECT_PREPARED,
            effect,
            ns,
            principal,
            attempt_id=attempt_id,
            claim_generation=claim_generation,
            owner_id=owner_id,
            detail={"outcome": outcome},
        )
    return Prepared(effect=effect, outcome=outcome, created=created)


def _transition(
    effect: Effect,
    to: str,
    *,
    at,
    principal: Principal | None,
    kind: str,
    attempt_id: Any = None,
    claim_generation: int | None = None,
    external_ref: str | None = None,
    detail: dict | None = None,
):
    frm = effect.state
    effect.state = to
    effect.updated_at = at
    fields = ["state", "updated_at"]
    if external_ref is not None:
        effect.external_ref = external_ref[:500]
        fields.append("external_ref")
    if to == E.PREPARED and effect.dispatched_at is not None:
        effect.dispatched_at = None  # back to PREPARED: no longer in flight, the node is free
        fields.append("dispatched_at")
    effect.save(update_fields=fields)
    _history(
        effect,
        kind,
        at=at,
        principal=principal,
        frm=frm,
        to=to,
        attempt_id=attempt_id,
        claim_generation=claim_generation,
        detail={**({"external_ref": external_ref} if external_ref else {}), **(detail or {})},
    )


# Ledger entries by which an attempt (or an operator) acts on an effect; an approval or an ignored delivery is not.
_ACTS_ON_EFFECT = ["prepared", "prepare_seen", "dispatch_recorded", "delivered", "outcome", "reconciled"]


def _last_to_act(effect: Effect) -> Any:
    """The attempt (None for an operator) whose entry is the newest act on the effect's ledger — read under the
    effect row's lock, which every ledger writer holds."""
    return (
        EffectEvent.objects.filter(effect=effect, kind__in=_ACTS_ON_EFFECT)
        .order_by("-id")
        .values_list("attempt_id", flat=True)
        .first()
    )


def effect_record_outcome(
    *,
    principal: Principal,
    effect_id: str,
    state: str,
    attempt_id: uuid.UUID,
    claim_generation: int,
    scheduler_epoch: int,
    owner_id: str,
    external_ref: str | None = None,
) -> Effect:
    """Record what happened at the target: COMMITTED, FAILED (a definite refusal) or UNKNOWN (a timeout — never
    FAILED). Allowed from PREPARED or UNKNOWN.

    Whose report counts, decided under the task and effect row locks:
    - the task's current attempt, with full authority (CANCELLED / FENCED otherwise);
    - an older attempt — fenced, expired, replaced — only about its own part: while its entry is still the newest
      act on the effect's ledger. Once anyone else has acted on the effect since (a replacement prepared it,
      reconciled it, dispatched it; an operator reconciled it), the report is about a past the effect has moved
      on from, and is FENCED (ATTEMPT): it could otherwise fail the replacement's delivery in flight and let the
      target act twice (A23).
    - nobody while a dispatch intent is in flight: the dispatcher owns that delivery's outcome
      (INVALID_TRANSITION, DISPATCH_IN_FLIGHT).
    """
    if state not in _EVENT_FOR_STATE:
        raise Invalid({"state": ["Must be one of COMMITTED, UNKNOWN, FAILED."]})
    task_id = _task_of(effect_id)
    request = _Request(principal, attempt_id, claim_generation, scheduler_epoch, owner_id)
    with _at_effect_point(request, task_id, effect_id=effect_id) as (ns, task, effect):
        if effect is None:
            raise NotFound("no such effect")
        if owner_id != principal.owner_id:
            raise Forbidden(f"this token acts as {principal.owner_id!r}, not {owner_id!r}")
        attempt_owner = (
            Attempt.objects.filter(pk=attempt_id, task_id=task_id).values_list("owner_id", flat=True).first()
        )
        if attempt_owner is not None and attempt_owner != principal.owner_id:
            raise Forbidden(f"attempt {attempt_id} is not {principal.owner_id!r}'s")
        if attempt_owner is None or attempt_id == task.attempt_id:
            request.authorise(task, ns)
        elif _last_to_act(effect) != attempt_id:
            raise Fenced(
                "the effect has moved on since this attempt acted on it: its report is not about the effect now",
                reason="ATTEMPT",
                current={**task_current(task, ns), **effect_current(effect)},
            )
        if effect.state not in _OUTCOME_FROM:
            raise InvalidTransition(
                f"an outcome cannot follow {effect.state}", current=effect_current(effect)
            )
        if DispatchIntent.objects.filter(
            effect=effect, state__in=[DispatchState.PENDING, DispatchState.SENDING]
        ).exists():
            raise InvalidTransition(
                "a dispatch of this effect is in flight: its delivery records the outcome",
                reason="DISPATCH_IN_FLIGHT",
                current=effect_current(effect),
            )
        _transition(
            effect,
            state,
            at=ns.now,
            principal=principal,
            kind="outcome",
            attempt_id=attempt_id,
            claim_generation=claim_generation,
            external_ref=external_ref,
        )
        _task_event(
            _EVENT_FOR_STATE[state],
            effect,
            ns,
            principal,
            attempt_id=attempt_id,
            claim_generation=claim_generation,
            owner_id=owner_id,
        )
    return effect


def effect_reconcile(
    *,
    principal: Principal,
    effect_id: str,
    observed: str,
    external_ref: str | None = None,
    attempt_id: uuid.UUID | None = None,
    claim_generation: int | None = None,
    scheduler_epoch: int | None = None,
    owner_id: str | None = None,
) -> Effect:
    """Resolve an UNKNOWN effect from what the target says happened: OCCURRED → COMMITTED, NOT_OCCURRED →
    PREPARED (to be executed under the same key). Only from UNKNOWN (NOT_UNKNOWN otherwise). By the task's
    current attempt (a worker, with full authority) or by an operator, audited — how the drain's UNKNOWN backlog
    is cleared when no attempt is live."""
    if observed not in ("OCCURRED", "NOT_OCCURRED"):
        raise Invalid({"observed": ["Must be OCCURRED or NOT_OCCURRED."]})
    task_id = _task_of(effect_id)
    request = _Request(principal, attempt_id, claim_generation, scheduler_epoch, owner_id)
    with _at_effect_point(request, task_id, effect_id=effect_id) as (ns, task, effect):
        if effect is None:
            raise NotFound("no such effect")
        if principal.role == Role.WORKER:
            request.authorise(task, ns)
        if effect.state != E.UNKNOWN:
            raise NotUnknown(
                f"only an UNKNOWN effect is reconciled; this one is {effect.state}",
                current=effect_current(effect),
            )
        to = E.COMMITTED if observed == "OCCURRED" else E.PREPARED
        _transition(
            effect,
            to,
            at=ns.now,
            principal=principal,
            kind="reconciled",
            attempt_id=attempt_id,
            claim_generation=claim_generation,
            external_ref=external_ref,
            detail={"observed": observed},
        )
        _task_event(
            EventKind.EFFECT_RECONCILED,
            effect,
            ns,
            principal,
            attempt_id=attempt_id,
            claim_generation=claim_generation,
            owner_id=owner_id,
            detail={"observed": observed},
            # An operator's reconcile is not worker traffic: audited, not counted at the acceptance point.
            point=principal.role == Role.WORKER,
        )
        if principal.role != Role.WORKER:
            audit(
                principal=principal,
                action="effect_reconcile",
                at=ns.now,
                namespace=ns.name,
                target=effect_id,
                detail={"observed": observed, "state": to},
            )
    return effect


def effect_approve(*, principal: Principal, effect_id: str, note: str = "") -> Effect:
    """An operator approves a NON_REPLAYABLE effect. Idempotent; the approval binds the payload digest and lasts
    through FAILED → PREPARED and a NOT_OCCURRED reconcile."""
    task_id = _task_of(effect_id)
    with transaction.atomic(durable=True):
        ns, _task = hold_task(task_id)
        effect = _lock_effect(effect_id)
        if not effect.non_replayable:
            raise InvalidTransition(
                "only a NON_REPLAYABLE task's effect needs approval", current=effect_current(effect)
            )
        if effect.state == E.COMMITTED:
            raise InvalidTransition("the effect already happened", current=effect_current(effect))
        if effect.approved_at is None:
            effect.approved_at, effect.approved_by, effect.updated_at = ns.now, principal.name, ns.now
            effect.save(update_fields=["approved_at", "approved_by", "updated_at"])
            _history(
                effect,
                "approved",
                at=ns.now,
                principal=principal,
                detail={"note": note, "payload_digest": effect.payload_digest},
            )
            _task_event(EventKind.EFFECT_APPROVED, effect, ns, principal, point=False, detail={"note": note})
            audit(
                principal=principal,
                action="effect_approve",
                at=ns.now,
                namespace=ns.name,
                target=effect_id,
                reason=note,
                detail={"payload_digest": effect.payload_digest},
            )
    return effect


def effect_dispatch(
    *,
    principal: Principal,
    effect_id: str,
    payload: Any,
    target: str,
    attempt_id: uuid.UUID,
    claim_generation: int,
    scheduler_epoch: int,
    owner_id: str,
) -> tuple[DispatchIntent, bool]:
    """Record the durable commitment to deliver ``payload`` to ``target`` under the effect's key — in the same
    transaction as the checks, so the order of records decides any race with a cancel or a takeover (A13).
    A repeat while the intent is in flight returns it. Delivery is a Celery job started after commit.

    Checks, in order: authority (CANCELLED / FENCED); the payload's digest is the bound one (PAYLOAD_CONFLICT);
    the effect is PREPARED (INVALID_TRANSITION) and, if NON_REPLAYABLE, approved (APPROVAL_REQUIRED) with no other
    effect of its node in flight (INVALID_TRANSITION, NODE_BUSY); no newer claim took the task's resources
    (STALE_INPUT, RESOURCE).
    """
    task_id = _task_of(effect_id)
    request = _Request(principal, attempt_id, claim_generation, scheduler_epoch, owner_id)
    with _at_effect_point(request, task_id, effect_id=effect_id) as (ns, task, effect):
        if effect is None:
            raise NotFound("no such effect")
        keys = []
        if task.resources:  # the last lock of the order (after task and effect); the clock is read after it
            keys, db_now = lock_keys(sorted(task.resources), lock="FOR SHARE")
            ns = ns.at(db_now)
        request.authorise(task, ns)
        in_flight = DispatchIntent.objects.filter(
            effect=effect, state__in=[DispatchState.PENDING, DispatchState.SENDING]
        ).first()
        if in_flight is not None:
            return in_flight, False
        if digest(payload) != effect.payload_digest:
            raise PayloadConflict(
                "the payload's digest is not the one bound at prepare", current=effect_current(effect)
            )
        if effect.state != E.PREPARED:
            raise InvalidTransition(
                f"only a PREPARED effect is dispatched; this one is {effect.state}",
                current=effect_current(effect),
            )
        if effect.non_replayable:
            if effect.approved_at is None:
                raise ApprovalRequired(
                    "an operator must approve this effect first", current=effect_current(effect)
                )
            busy = (
                Effect.objects.filter(
                    namespace_id=ns.id,
                    node_id=effect.node_id,
                    non_replayable=True,
                    dispatched_at__isnull=False,
                    state__in=[E.PREPARED, E.UNKNOWN],
                )
                .exclude(pk=effect.pk)
                .values_list("effect_id", flat=True)
                .first()
            )
            if busy:
                raise InvalidTransition(
                    f"effect {busy} of this node is still in flight",
                    reason="NODE_BUSY",
                    current=effect_current(effect),
                )
        fences = Attempt.objects.filter(pk=attempt_id).values_list("fences", flat=True).first() or {}
        check_dispatch_resources(keys, attempt_fences=fences)
        interleave.reach("effect_dispatch.checked")
        intent = DispatchIntent.objects.create(
            effect=effect,
            attempt_id=attempt_id,
            claim_generation=claim_generation,
            payload=payload,
            target=target,
            fence_headers={key: value["token"] for key, value in fences.items()},
            created_at=ns.now,
        )
        effect.dispatched_at, effect.updated_at = ns.now, ns.now
        effect.save(update_fields=["dispatched_at", "updated_at"])
        _history(
            effect,
            "dispatch_recorded",
            at=ns.now,
            principal=principal,
            attempt_id=attempt_id,
            claim_generation=claim_generation,
            detail={"dispatch_id": str(intent.pk), "target": target},
        )
        _task_event(
            EventKind.DISPATCH_RECORDED,
            effect,
            ns,
            principal,
            attempt_id=attempt_id,
            claim_generation=claim_generation,
            owner_id=owner_id,
            detail={"dispatch_id": str(intent.pk)},
        )
        from ..tasks import (
            deliver_dispatch,  # the Celery job; imported late to keep services importable alone
        )

        transaction.on_commit(lambda: deliver_dispatch.delay(str(intent.pk)))
    return intent, True
