"""Delivering a dispatch intent: the tool gateway's half that talks to the outside world.

Three steps, and no row is locked while the network is used:

1. Take the intent (compare-and-set PENDING → SENDING, or a SENDING intent whose sender went silent longer than
   ``DISPATCH_RESEND_AFTER_SECONDS``). A second runner of the same job finds nothing to take: jobs are safe to run
   twice at once. An effect that already left PREPARED/UNKNOWN is not sent at all (SKIPPED).
2. POST the payload as canonical JSON with ``Idempotency-Key: <effect_id>`` (the same key on every delivery of the
   effect, retries included), ``X-Claim-Generation`` and one ``X-Fence-Token`` per resource. Redirects are not
   followed.
3. Apply the reply to the effect — only while it is still PREPARED or UNKNOWN: 2xx → COMMITTED (status as
   external_ref); 4xx → FAILED (a definite refusal); a timeout, a connection error, a 3xx or a 5xx → UNKNOWN, since
   the target may have acted. Nothing re-sends from UNKNOWN on its own: it is reconciled first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import Q

from .. import clock, interleave
from ..digest import canonical_json
from ..models import DispatchIntent, DispatchState, Effect, EffectState
from . import _sql, ledger
from ._base import append_event
from ._sql import writes_together

logger = logging.getLogger(__name__)

_APPLIES_TO = (EffectState.PREPARED, EffectState.UNKNOWN)


@dataclass(frozen=True)
class Delivery:
    dispatch_id: str
    sent: bool
    outcome: str  # COMMITTED | FAILED | UNKNOWN | SKIPPED | NOT_TAKEN
    status_code: int | None = None


def _take(dispatch_id: str) -> DispatchIntent | None:
    with transaction.atomic(durable=True):
        now = clock.now()
        stale = now - timedelta(seconds=settings.DISPATCH_RESEND_AFTER_SECONDS)
        taken = DispatchIntent.objects.filter(
            Q(state=DispatchState.PENDING) | Q(state=DispatchState.SENDING, sending_at__lt=stale),
            pk=dispatch_id,
            inline=False,  # an inline intent's sender is its recorder; no job sends it
        ).update(state=DispatchState.SENDING, sending_at=now)
        if taken != 1:
            return None
        intent = DispatchIntent.objects.select_related("effect").get(pk=dispatch_id)
        if intent.effect.state not in _APPLIES_TO:
            intent.state, intent.outcome, intent.finished_at = DispatchState.SKIPPED, "SKIPPED", now
            intent.save(update_fields=["state", "outcome", "finished_at"])
            return None
        DispatchIntent.objects.filter(pk=dispatch_id).update(deliveries=intent.deliveries + 1)
        return intent


def _send(intent: DispatchIntent) -> tuple[str, int | None, str, bool]:
    """The POST: (state, status code, error, whether anything left — False only when no connection was made)."""
    headers = {
        "Content-Type": "application/json",
        "Idempotency-Key": intent.effect_id,
        "X-Claim-Generation": str(intent.claim_generation),
    }
    fence_values = [f"{key}={token}" for key, token in sorted(intent.fence_headers.items())]
    request_headers = list(headers.items()) + [("X-Fence-Token", value) for value in fence_values]
    try:
        with httpx.Client(timeout=settings.DISPATCH_TIMEOUT_SECONDS, follow_redirects=False) as client:
            reply = client.post(
                intent.target, content=canonical_json(intent.payload), headers=request_headers
            )
    except (
        httpx.HTTPError
    ) as exc:  # timeout, refused, reset: UNKNOWN (claim-v1.md §6), even when nothing left
        unsent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
        return EffectState.UNKNOWN, None, f"{type(exc).__name__}: {exc}"[:500], not unsent
    if 200 <= reply.status_code < 300:
        return EffectState.COMMITTED, reply.status_code, "", True
    if 400 <= reply.status_code < 500:
        return EffectState.FAILED, reply.status_code, f"HTTP {reply.status_code}", True
    return EffectState.UNKNOWN, reply.status_code, f"HTTP {reply.status_code}", True


def _apply(intent: DispatchIntent, state: str, status_code: int | None, error: str, sent: bool) -> str:
    ref = str(status_code) if status_code is not None else None
    return dispatch_apply(
        dispatch_id=str(intent.pk), state=state, external_ref=ref, error=error, reply=status_code, sent=sent
    )


def dispatch_apply(
    *,
    dispatch_id: str,
    state: str,
    external_ref: str | None,
    error: str = "",
    reply: Any = None,
    also: Callable[[Effect, str, datetime], None] | None = None,
    silent_for_seconds: float | None = None,
    sent: bool = True,
) -> str:
    """Record a delivery's reply on its effect: ``state`` (COMMITTED, FAILED or UNKNOWN) while the effect is still
    PREPARED or UNKNOWN, SKIPPED otherwise; NOT_TAKEN when the intent is no longer SENDING (another hand recorded
    it). ``also(effect, outcome, now)`` runs in the same transaction, under the same locks, with the clock read
    there — the gateway keeps the tool's answer beside the effect's state (its writes join the others: one round
    trip). With ``silent_for_seconds``, only an intent whose sender has been silent at least that long (by the clock
    read under the locks; silence counts from its last sign of life, ``heard_at``, else from the send's start) is
    taken: how a sender that went silent is recorded UNKNOWN (``dispatch_lost``). ``sent=False``: the sender knows
    nothing left (no connection could be made) — kept on the intent as ``not_sent``.

    Locks: the effect row, then the intent row (the order of every effect write, services/effects.py)."""
    with transaction.atomic(durable=True):
        effect = Effect.objects.select_for_update().get(
            pk=DispatchIntent.objects.filter(pk=dispatch_id).values("effect_id")[:1]
        )
        current = DispatchIntent.objects.select_for_update().get(pk=dispatch_id)
        now = clock.now()
        interleave.reach("dispatch_apply.locked")
        if current.state != DispatchState.SENDING:
            return "NOT_TAKEN"
        last_heard = current.heard_at or current.sending_at
        if silent_for_seconds is not None and (
            last_heard is None or last_heard > now - timedelta(seconds=silent_for_seconds)
        ):
            return "NOT_TAKEN"
        outcome = state if effect.state in _APPLIES_TO else "SKIPPED"
        with writes_together():  # the decision is made: its writes leave in one round trip
            _delivered(
                effect,
                current,
                outcome,
                now=now,
                external_ref=external_ref,
                error=error,
                reply=reply,
                sent=sent,
            )
            if also is not None:
                also(effect, outcome, now)
    return outcome


def _delivered(
    effect: Effect,
    intent: DispatchIntent,
    outcome: str,
    *,
    now: datetime,
    external_ref: str | None,
    error: str,
    reply: Any,
    sent: bool,
) -> None:
    """A delivery's records (``dispatch_apply``'s writes): the intent finished; the effect moved to ``outcome`` with
    its ledger entry and event — or, SKIPPED, the reply noted on a ledger that had moved on."""
    applied = outcome != "SKIPPED"
    _sql.write(
        _sql.update_statement(
            DispatchIntent,
            {"dispatch_id": intent.pk},
            state=DispatchState.DELIVERED if applied else DispatchState.SKIPPED,
            outcome=outcome,
            last_error=error,
            finished_at=now,
            not_sent=not sent,
        )
    )
    if not applied:
        ledger.record(
            effect,
            "delivery_ignored",
            at=now,
            principal=None,
            detail={"dispatch_id": str(intent.pk), "reply": reply, "state": effect.state},
        )
        return
    ledger.transition(
        effect,
        outcome,
        at=now,
        principal=None,
        kind="delivered",
        attempt_id=intent.attempt_id,
        claim_generation=intent.claim_generation,
        external_ref=external_ref,
        detail={"dispatch_id": str(intent.pk), "error": error},
    )
    append_event(
        ledger.EVENT_FOR_STATE[outcome],
        namespace_id=effect.namespace_id,
        task_id=effect.task_id,
        at=now,
        principal=None,
        attempt_id=intent.attempt_id,
        claim_generation=intent.claim_generation,
        detail={"effect_id": effect.effect_id, "dispatch_id": str(intent.pk), "reply": reply},
    )


def dispatch_deliver(*, dispatch_id: str) -> Delivery:
    """Deliver one intent (the ``deliver_dispatch`` Celery job calls this)."""
    intent = _take(dispatch_id)
    if intent is None:
        return Delivery(dispatch_id, sent=False, outcome="NOT_TAKEN")
    state, status_code, error, sent = _send(intent)
    outcome = _apply(intent, state, status_code, error, sent)
    logger.info("dispatch %s delivered: %s (reply %s)", dispatch_id, outcome, status_code)
    return Delivery(dispatch_id, sent=True, outcome=outcome, status_code=status_code)


def dispatch_stuck(*, older_than_seconds: int | None = None) -> list[str]:
    """Intents whose delivery never finished: PENDING past the resend window (the enqueue was lost) or SENDING
    past it (the deliverer died mid-send). The ``redeliver_dispatches`` job sends each again — under the same
    Idempotency-Key, so a target that already acted recognises the repeat."""
    window = timedelta(seconds=older_than_seconds or settings.DISPATCH_RESEND_AFTER_SECONDS)
    cutoff = clock.now() - window
    return [
        str(pk)
        for pk in DispatchIntent.objects.filter(
            Q(state=DispatchState.PENDING, created_at__lt=cutoff)
            | Q(state=DispatchState.SENDING, sending_at__lt=cutoff),
            inline=False,
        ).values_list("pk", flat=True)[:500]
    ]


def dispatch_heard(*, dispatch_id: str) -> bool:
    """A sign of life from an inline intent's sender mid-call (the target reported progress): silence is counted
    from now, so no other call records a long call lost while it runs. One conditional write; False when the intent
    is no longer SENDING (it was recorded — by its sender, or lost)."""
    return (
        DispatchIntent.objects.filter(pk=dispatch_id, state=DispatchState.SENDING).update(
            heard_at=clock.now()
        )
        == 1
    )


def dispatch_lost(*, dispatch_id: str, silent_for_seconds: float, why: str) -> str:
    """An inline intent whose sender went silent — its process died, or it is past any timeout it could have —
    recorded UNKNOWN: the target may have acted. Decided under the effect and intent locks on the clock read after
    them, so a sender that records its reply first wins and this takes nothing (NOT_TAKEN)."""
    return dispatch_apply(
        dispatch_id=dispatch_id,
        state=EffectState.UNKNOWN,
        external_ref=None,
        error=why[:500],
        silent_for_seconds=silent_for_seconds,
    )
