"""Recording a dispatch (claim-v1.md §6): the durable commitment to deliver a payload under an effect's key, in the
transaction of its checks; the delivery is the Celery job ``claims.deliver_dispatch`` (services/dispatch_delivery.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from .. import interleave
from ..digest import digest
from ..errors import ApprovalRequired, InvalidTransition, PayloadConflict
from ..models import Attempt, DispatchIntent, DispatchState, Effect, EventKind, Principal, ResourceKey
from ..models import EffectState as E
from . import _sql, ledger
from ._base import NamespaceHold, enqueue
from ._sql import writes_together
from .authority import Acceptance, Named
from .effect_point import at_effect_point, at_named_effect, authorise
from .effects import prepare_at
from .resources import check_dispatch_resources


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
    inline: bool = False,
) -> tuple[DispatchIntent, bool]:
    """Record the durable commitment to deliver ``payload`` to ``target`` under the effect's key — in the same
    transaction as the checks, so the order of records decides any race with a cancel or a takeover (A13).
    A repeat while the intent is in flight returns it. Delivery is a Celery job started after commit.

    Checks, in order: authority (CANCELLED / FENCED); the payload's digest is the bound one (PAYLOAD_CONFLICT);
    the effect is PREPARED (INVALID_TRANSITION) and, if NON_REPLAYABLE, approved (APPROVAL_REQUIRED) with no other
    effect of its node in flight (INVALID_TRANSITION, NODE_BUSY); no newer claim took the task's resources
    (STALE_INPUT, RESOURCE).

    ``inline``: the caller delivers it itself, now (``dispatch_apply`` records the reply): the intent is recorded
    already SENDING, and no job is started for it.
    """
    named = Named(attempt_id, claim_generation, scheduler_epoch, owner_id)
    with at_named_effect(principal, effect_id, named) as (at, effect):
        keys = at.hold_keys()
        authorise(at)
        return _record_intent(at, effect, keys, payload=payload, target=target, inline=inline)


def _new_intent(
    effect: Effect,
    ns: NamespaceHold,
    *,
    payload: Any,
    target: str,
    attempt_id: uuid.UUID,
    claim_generation: int,
    fences: dict[str, Any],
    inline: bool,
) -> DispatchIntent:
    """The intent's row, written with the acceptance point's other writes (``_sql.write``): an inline one is
    SENDING from the start — its send begins once the transaction commits."""
    intent = DispatchIntent(
        dispatch_id=uuid.uuid4(),
        effect=effect,
        attempt_id=attempt_id,
        claim_generation=claim_generation,
        payload=payload,
        target=target,
        fence_headers={key: value["token"] for key, value in fences.items()},
        created_at=ns.now,
        inline=inline,
        state=DispatchState.SENDING if inline else DispatchState.PENDING,
        sending_at=ns.now if inline else None,
        deliveries=1 if inline else 0,
    )
    _sql.write(
        _sql.insert_statement(
            DispatchIntent,
            **{f.attname: getattr(intent, f.attname) for f in DispatchIntent._meta.concrete_fields},
        )
    )
    intent._state.adding, intent._state.db = False, "default"  # written (or about to be, with the others)
    return intent


def _record_intent(
    at: Acceptance,
    effect: Effect,
    keys: list[ResourceKey],
    *,
    payload: Any,
    target: str,
    inline: bool,
    fresh: bool = False,
) -> tuple[DispatchIntent, bool]:
    """A dispatch's checks after authority and its records, inside the caller's acceptance point (its locks held;
    the attempt, generation and owner the request named are the acceptance's): the intent in flight if there is
    one; else the payload, state, approval and resource checks, then the intent, the effect's ``dispatched_at`` and
    the ledger's entries — and, unless ``inline``, the delivery job on commit."""
    ns, principal = at.ns, at.principal
    attempt_id, claim_generation = at.attempt_id, at.claim_generation
    assert claim_generation is not None  # an effect call names its attempt's generation
    # An effect made in this transaction (``fresh``) has no intent yet: nothing to look for.
    in_flight = (
        None
        if fresh
        else DispatchIntent.objects.filter(
            effect=effect, state__in=[DispatchState.PENDING, DispatchState.SENDING]
        ).first()
    )
    if in_flight is not None:
        return in_flight, False
    _require_dispatchable(effect, payload, ns)
    # The fences a claim took are those of its task's resources: none to read when the task lists none.
    fences = (
        (Attempt.objects.filter(pk=attempt_id).values_list("fences", flat=True).first() or {}) if keys else {}
    )
    check_dispatch_resources(keys, attempt_fences=fences)
    interleave.reach("effect_dispatch.checked")
    intent = _new_intent(
        effect,
        ns,
        payload=payload,
        target=target,
        attempt_id=attempt_id,
        claim_generation=claim_generation,
        fences=fences,
        inline=inline,
    )
    if (
        effect.dispatched_at != ns.now or effect.updated_at != ns.now
    ):  # not already written with the new effect
        effect.dispatched_at, effect.updated_at = ns.now, ns.now
        effect.save(update_fields=["dispatched_at", "updated_at"])
    ledger.record(
        effect,
        "dispatch_recorded",
        at=ns.now,
        principal=principal,
        attempt_id=attempt_id,
        claim_generation=claim_generation,
        detail={"dispatch_id": str(intent.pk), "target": target},
    )
    ledger.event_at(EventKind.DISPATCH_RECORDED, effect, at, detail={"dispatch_id": str(intent.pk)})
    if not inline:
        transaction.on_commit(lambda: enqueue("claims.deliver_dispatch", str(intent.pk)))
    return intent, True


@dataclass(frozen=True)
class PreparedDispatch:
    effect: Effect
    outcome: str  # effect_prepare's: PREPARED | RECONCILE_REQUIRED | ALREADY_COMMITTED | APPROVAL_REQUIRED
    created: bool
    intent: DispatchIntent | None  # with PREPARED: the intent recorded now, or the one in flight
    recorded: bool  # the intent is this call's


def effect_prepare_dispatch(
    *,
    principal: Principal,
    task_id: str,
    effect_slot: str,
    payload: Any,
    target: str,
    attempt_id: uuid.UUID,
    claim_generation: int,
    scheduler_epoch: int,
    owner_id: str,
    non_replayable: bool = False,
    inline: bool = True,
    also: Callable[[Effect], None] | None = None,
) -> PreparedDispatch:
    """``effect_prepare`` and, when it answers PREPARED, ``effect_dispatch`` — in one transaction at one acceptance
    point: the MCP gateway's step before it calls a tool. The payload's digest is what is bound; the locks are the
    task row with its namespace, the effect row, then the task's resource keys (FOR SHARE), the clock read after
    them all. Any refusal rolls the whole step back. ``also(effect)`` runs in the same transaction when the effect is
    new or an intent was recorded now (the gateway writes its tool call beside the effect)."""
    with (
        at_effect_point(
            principal,
            task_id,
            Named(attempt_id, claim_generation, scheduler_epoch, owner_id),
            effect_slot=effect_slot,
        ) as (at, existing),
        writes_together(),
    ):  # reads and checks first; the writes leave at the end, at once
        keys = at.hold_keys()
        effect, outcome = prepare_at(
            at,
            existing,
            effect_slot=effect_slot,
            payload_digest=digest(payload),
            non_replayable=non_replayable,
            dispatching=True,
        )
        if outcome != "PREPARED":
            if also is not None and existing is None:
                also(effect)
            return PreparedDispatch(effect, outcome, existing is None, None, False)
        intent, recorded = _record_intent(
            at, effect, keys, payload=payload, target=target, inline=inline, fresh=existing is None
        )
        if also is not None and (existing is None or recorded):
            also(effect)
        return PreparedDispatch(effect, outcome, existing is None, intent, recorded)


def _require_dispatchable(effect: Effect, payload: Any, ns: NamespaceHold) -> None:
    """The dispatch's checks after authority, in order: the payload's digest is the bound one (PAYLOAD_CONFLICT);
    the effect is PREPARED (INVALID_TRANSITION) and, if NON_REPLAYABLE, approved (APPROVAL_REQUIRED) with no other
    effect of its node in flight (INVALID_TRANSITION, NODE_BUSY)."""
    if digest(payload) != effect.payload_digest:
        raise PayloadConflict(
            "the payload's digest is not the one bound at prepare", current=ledger.effect_current(effect)
        )
    if effect.state != E.PREPARED:
        raise InvalidTransition(
            f"only a PREPARED effect is dispatched; this one is {effect.state}",
            current=ledger.effect_current(effect),
        )
    if not effect.non_replayable:
        return
    if effect.approved_at is None:
        raise ApprovalRequired(
            "an operator must approve this effect first", current=ledger.effect_current(effect)
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
            current=ledger.effect_current(effect),
        )
