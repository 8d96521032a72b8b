"""The effect ledger's transitions, in one public module: every change of an effect's state, and every entry of
its append-only history, is written here — by the worker and operator calls (``effects``) and by the dispatcher's
delivery (``dispatch``) alike. Each function runs inside its caller's transaction, with the effect row locked
(FOR UPDATE) by the caller: the lock every ledger writer holds. The writes go through ``_sql.write``: inside a
caller's ``writes_together`` block they leave in one round trip with the decision's other writes.

The states: PREPARED → COMMITTED | FAILED | UNKNOWN; UNKNOWN → PREPARED (reconciled NOT_OCCURRED) | COMMITTED
(reconciled OCCURRED, or a late delivery) | FAILED.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..models import AcceptancePoint, Effect, EffectEvent, EffectState, EventKind, Principal
from . import _sql
from ._base import NamespaceHold, append_event

if TYPE_CHECKING:
    from .authority import Acceptance

E = EffectState

# A reported outcome moves the effect; anything else is INVALID_TRANSITION.
OUTCOME_FROM: set[str] = {E.PREPARED, E.UNKNOWN}
EVENT_FOR_STATE: dict[str, EventKind] = {
    E.COMMITTED: EventKind.EFFECT_COMMITTED,
    E.UNKNOWN: EventKind.EFFECT_UNKNOWN,
    E.FAILED: EventKind.EFFECT_FAILED,
}


def effect_current(effect: Effect) -> dict[str, Any]:
    return {
        "effect_id": effect.effect_id,
        "state": effect.state,
        "bound_payload_digest": effect.payload_digest,
    }


def record(
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
    _sql.write(
        _sql.insert_statement(
            EffectEvent,
            effect_id=effect.effect_id,
            kind=kind,
            from_state=frm,
            to_state=to,
            at=at,
            attempt_id=attempt_id,
            claim_generation=claim_generation,
            principal=principal.name if principal else "",
            detail=detail or {},
        )
    )


def task_event(
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
        **ns.on(
            effect.task_id,
            principal,
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
        ),
    )


def event_at(
    kind: EventKind, effect: Effect, at: Acceptance, *, point: bool = True, detail: dict | None = None
) -> None:
    """The effect's timeline row for a request at its acceptance point, naming what the request named (its
    attempt, generation and owner)."""
    task_event(
        kind,
        effect,
        at.ns,
        at.principal,
        attempt_id=at.attempt_id,
        claim_generation=at.claim_generation,
        owner_id=at.owner_id,
        point=point,
        detail=detail,
    )


def transition(
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
    _sql.write(
        _sql.update_statement(
            Effect, {"effect_id": effect.effect_id}, **{f: getattr(effect, f) for f in fields}
        )
    )
    record(
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
ACTS_ON_EFFECT = ["prepared", "prepare_seen", "dispatch_recorded", "delivered", "outcome", "reconciled"]


def last_to_act(effect: Effect) -> Any:
    """The attempt (None for an operator) whose entry is the newest act on the effect's ledger — read under the
    effect row's lock, which every ledger writer holds."""
    return (
        EffectEvent.objects.filter(effect=effect, kind__in=ACTS_ON_EFFECT)
        .order_by("-id")
        .values_list("attempt_id", flat=True)
        .first()
    )
