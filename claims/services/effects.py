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
from dataclasses import dataclass

from django.db import transaction

from ..digest import effect_id as make_effect_id
from ..errors import (
    Fenced,
    Forbidden,
    Invalid,
    InvalidTransition,
    NotUnknown,
    PayloadConflict,
)
from ..models import (
    Attempt,
    DispatchIntent,
    DispatchState,
    Effect,
    EffectState,
    EventKind,
    Principal,
    ReplayPolicy,
    Role,
)
from . import ledger
from ._base import hold_task, task_current
from .authority import Acceptance, Named
from .effect_point import at_effect_point, at_named_effect, authorise, lock_effect, task_of

E = EffectState


@dataclass(frozen=True)
class Prepared:
    effect: Effect
    outcome: str  # PREPARED | RECONCILE_REQUIRED | ALREADY_COMMITTED | APPROVAL_REQUIRED
    created: bool


# What a worker may do next, by the state its prepare found the effect in (FAILED was moved back to PREPARED).
_NEXT_STEP: dict[str, str] = {
    E.PREPARED: "PREPARED",
    E.UNKNOWN: "RECONCILE_REQUIRED",
    E.COMMITTED: "ALREADY_COMMITTED",
}


def next_step(effect: Effect) -> str:
    """What a worker may do next with an effect its prepare bound (FAILED was moved back to PREPARED)."""
    outcome = _NEXT_STEP[effect.state]
    if outcome == "PREPARED" and effect.non_replayable and effect.approved_at is None:
        return "APPROVAL_REQUIRED"
    return outcome


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
    non_replayable: bool = False,
) -> Prepared:
    """Bind the slot's payload and say what the worker may do next.

    No record: create it PREPARED, bound to ``payload_digest`` (201). A record with another digest:
    PAYLOAD_CONFLICT. The same digest: PREPARED (go on), RECONCILE_REQUIRED (UNKNOWN: reconcile first),
    ALREADY_COMMITTED (make no call), or — after a definite FAILED — PREPARED again under the same key.
    A NON_REPLAYABLE task's effect answers APPROVAL_REQUIRED (202) until an operator approves it — as does one
    the caller marks ``non_replayable`` (the MCP gateway, for a tool its operator set NON_REPLAYABLE).
    """
    with at_effect_point(
        principal,
        task_id,
        Named(attempt_id, claim_generation, scheduler_epoch, owner_id),
        effect_slot=effect_slot,
    ) as (at, existing):
        effect, outcome = prepare_at(
            at,
            existing,
            effect_slot=effect_slot,
            payload_digest=payload_digest,
            non_replayable=non_replayable,
        )
    return Prepared(effect=effect, outcome=outcome, created=existing is None)


def prepare_at(
    at: Acceptance,
    existing: Effect | None,
    *,
    effect_slot: str,
    payload_digest: str,
    non_replayable: bool,
    dispatching: bool = False,
) -> tuple[Effect, str]:
    """A prepare inside an effect acceptance point whose locks are held (``effect_prepare``, and the gateway's
    ``effect_prepare_dispatch``): authority, the slot bound to ``payload_digest``, the timeline's event, and what
    the worker may do next. ``dispatching``: the caller records its dispatch in this transaction when it may (a new
    effect that needs no approval is written with its ``dispatched_at`` at once, instead of a second write)."""
    authorise(at)
    attempt_id, claim_generation = at.attempt_id, at.claim_generation
    assert claim_generation is not None  # a prepare names its claim (the serializers require it)
    effect = _bound(
        at,
        existing,
        effect_slot=effect_slot,
        payload_digest=payload_digest,
        attempt_id=attempt_id,
        claim_generation=claim_generation,
        non_replayable=non_replayable,
        dispatching=dispatching,
    )
    outcome = next_step(effect)
    ledger.event_at(EventKind.EFFECT_PREPARED, effect, at, detail={"outcome": outcome})
    return effect, outcome


def _bound(
    at: Acceptance,
    existing: Effect | None,
    *,
    effect_slot: str,
    payload_digest: str,
    attempt_id: uuid.UUID,
    claim_generation: int,
    non_replayable: bool = False,
    dispatching: bool = False,
) -> Effect:
    """The slot's effect bound to ``payload_digest``: created PREPARED, or the existing one (PAYLOAD_CONFLICT when
    bound to another payload; a definite FAILED moved back to PREPARED), its ledger told."""
    ns, task, principal = at.ns, at.task, at.principal
    effect: Effect
    if existing is None:
        eid = make_effect_id(task.task_id, task.node_id, effect_slot)
        approval = non_replayable or task.replay_policy == ReplayPolicy.NON_REPLAYABLE
        # The task row lock serialises every prepare of this task, so the insert cannot race another.
        effect = Effect.objects.create(
            effect_id=eid,
            task_id=task.task_id,
            namespace_id=ns.id,
            node_id=task.node_id,
            effect_slot=effect_slot,
            state=E.PREPARED,
            payload_digest=payload_digest,
            non_replayable=approval,
            created_at=ns.now,
            updated_at=ns.now,
            dispatched_at=ns.now if dispatching and not approval else None,
        )
        ledger.record(
            effect,
            "prepared",
            at=ns.now,
            principal=principal,
            to=E.PREPARED,
            attempt_id=attempt_id,
            claim_generation=claim_generation,
            detail={"payload_digest": payload_digest},
        )
    elif (effect := existing).payload_digest != payload_digest:
        raise PayloadConflict("this slot is bound to another payload", current=ledger.effect_current(effect))
    elif effect.state == E.FAILED:
        # A definite failure: the target did not act. Retry under the same key.
        ledger.transition(
            effect,
            E.PREPARED,
            at=ns.now,
            principal=principal,
            kind="prepared",
            attempt_id=attempt_id,
            claim_generation=claim_generation,
        )
    else:
        ledger.record(
            effect,
            "prepare_seen",
            at=ns.now,
            principal=principal,
            attempt_id=attempt_id,
            claim_generation=claim_generation,
            detail={"state": effect.state},
        )
    return effect


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
    if state not in ledger.EVENT_FOR_STATE:
        raise Invalid({"state": ["Must be one of COMMITTED, UNKNOWN, FAILED."]})
    named = Named(attempt_id, claim_generation, scheduler_epoch, owner_id)
    with at_named_effect(principal, effect_id, named) as (at, effect):
        ns = at.ns
        _authorise_report(at, effect, principal=principal, owner_id=owner_id, attempt_id=attempt_id)
        if effect.state not in ledger.OUTCOME_FROM:
            raise InvalidTransition(
                f"an outcome cannot follow {effect.state}", current=ledger.effect_current(effect)
            )
        if DispatchIntent.objects.filter(
            effect=effect, state__in=[DispatchState.PENDING, DispatchState.SENDING]
        ).exists():
            raise InvalidTransition(
                "a dispatch of this effect is in flight: its delivery records the outcome",
                reason="DISPATCH_IN_FLIGHT",
                current=ledger.effect_current(effect),
            )
        ledger.transition(
            effect,
            state,
            at=ns.now,
            principal=principal,
            kind="outcome",
            attempt_id=attempt_id,
            claim_generation=claim_generation,
            external_ref=external_ref,
        )
        ledger.event_at(ledger.EVENT_FOR_STATE[state], effect, at)
    return effect


def _authorise_report(
    at: Acceptance, effect: Effect, *, principal: Principal, owner_id: str, attempt_id: uuid.UUID
) -> None:
    """Whose outcome report counts (``effect_record_outcome``): the caller's own attempt; the task's current one with
    full authority, an older one only while it was the last to act on the effect (FENCED ATTEMPT otherwise)."""
    task, ns = at.task, at.ns
    if owner_id != principal.owner_id:
        raise Forbidden(f"this token acts as {principal.owner_id!r}, not {owner_id!r}")
    attempt_owner = (
        Attempt.objects.filter(pk=attempt_id, task_id=task.pk).values_list("owner_id", flat=True).first()
    )
    if attempt_owner is not None and attempt_owner != principal.owner_id:
        raise Forbidden(f"attempt {attempt_id} is not {principal.owner_id!r}'s")
    if attempt_owner is None or attempt_id == task.attempt_id:
        authorise(at)
    elif ledger.last_to_act(effect) != attempt_id:
        raise Fenced(
            "the effect has moved on since this attempt acted on it: its report is not about the effect now",
            reason="ATTEMPT",
            current={**task_current(task, ns), **ledger.effect_current(effect)},
        )


def _reason_for(principal: Principal, observed: str, reason: str) -> str:
    """An operator's reconcile is audited with its reason; NOT_OCCURRED (which sends the effect again) needs one."""
    reason = (reason or "").strip()
    if principal.role != Role.WORKER and observed == "NOT_OCCURRED" and not reason:
        raise Invalid(
            {
                "reason": [
                    "Saying it did not occur sends the effect again, and the target may have acted: give the "
                    "reason (what you checked at the target)."
                ]
            }
        )
    return reason


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
    reason: str = "",
) -> Effect:
    """Resolve an UNKNOWN effect from what the target says happened: OCCURRED → COMMITTED, NOT_OCCURRED →
    PREPARED (to be executed under the same key). Only from UNKNOWN (NOT_UNKNOWN otherwise). By the task's
    current attempt (a worker, with full authority, on its own evidence: ``external_ref``) or by an operator,
    audited with ``reason`` — how the drain's UNKNOWN backlog is cleared when no attempt is live. An operator's
    NOT_OCCURRED needs a reason: it makes the effect be sent again, and the target may have acted."""
    if observed not in ("OCCURRED", "NOT_OCCURRED"):
        raise Invalid({"observed": ["Must be OCCURRED or NOT_OCCURRED."]})
    reason = _reason_for(principal, observed, reason)
    named = Named(attempt_id, claim_generation, scheduler_epoch, owner_id)
    with at_named_effect(principal, effect_id, named) as (at, effect):
        ns = at.ns
        if principal.role == Role.WORKER:
            authorise(at)
        if effect.state != E.UNKNOWN:
            raise NotUnknown(
                f"only an UNKNOWN effect is reconciled; this one is {effect.state}",
                current=ledger.effect_current(effect),
            )
        to = E.COMMITTED if observed == "OCCURRED" else E.PREPARED
        ledger.transition(
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
        # An operator's reconcile is not worker traffic: audited, not counted at the acceptance point.
        worker = principal.role == Role.WORKER
        ledger.event_at(EventKind.EFFECT_RECONCILED, effect, at, point=worker, detail={"observed": observed})
        if principal.role != Role.WORKER:
            ns.audit(
                principal,
                "effect_reconcile",
                target=effect_id,
                reason=reason,
                detail={"observed": observed, "state": to, "external_ref": external_ref or ""},
            )
    return effect


def effect_approve(*, principal: Principal, effect_id: str, note: str = "") -> Effect:
    """An operator approves a NON_REPLAYABLE effect. Idempotent; the approval binds the payload digest and lasts
    through FAILED → PREPARED and a NOT_OCCURRED reconcile."""
    task_id = task_of(effect_id)
    with transaction.atomic(durable=True):
        ns, _task = hold_task(task_id)
        effect = lock_effect(effect_id)
        if not effect.non_replayable:
            raise InvalidTransition(
                "only a NON_REPLAYABLE task's effect needs approval", current=ledger.effect_current(effect)
            )
        if effect.state == E.COMMITTED:
            raise InvalidTransition("the effect already happened", current=ledger.effect_current(effect))
        if effect.approved_at is None:
            effect.approved_at, effect.approved_by, effect.updated_at = ns.now, principal.name, ns.now
            effect.save(update_fields=["approved_at", "approved_by", "updated_at"])
            ledger.record(
                effect,
                "approved",
                at=ns.now,
                principal=principal,
                detail={"note": note, "payload_digest": effect.payload_digest},
            )
            ledger.task_event(
                EventKind.EFFECT_APPROVED, effect, ns, principal, point=False, detail={"note": note}
            )
            ns.audit(
                principal,
                "effect_approve",
                target=effect_id,
                reason=note,
                detail={"payload_digest": effect.payload_digest},
            )
    return effect
