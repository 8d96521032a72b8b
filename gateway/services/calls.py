"""One MCP ``tools/call`` as an effect of the caller's claim (docs/mcp.md).

The steps, each its own transaction in the core's ledger (the server in ``gateway.mcp`` drives them and does the
network I/O between them, never with a row locked):

1. ``call_plan``: what the call is — the attempt named by the endpoint (or ``_meta``) and the claim it was granted,
   the downstream server and tool behind the exposed name, the operator's rule, the effect slot (the caller's, or
   the rule's: an argument's value, or the tool with its canonical arguments) and the payload digest (the tool and
   its canonical arguments). Nothing is written.
2. ``call_begin``: at the effect acceptance point (``effect_prepare``: epoch, generation, cancel generation, lease,
   decided under the task and effect row locks) the effect is bound to the payload digest; then, for a PREPARED
   effect, ``effect_dispatch(inline=True)`` checks authority again under the same locks and records the durable
   intent to send, already SENDING — the unique in-flight intent per effect is what lets only one caller send.
   The answer is a ``Step``: SEND (this caller sends), WAIT (another call of the slot is sending), RECONCILE (an
   earlier call's outcome is UNKNOWN and the rule can ask the server), or ANSWER (a recorded result, a refusal).
3. ``call_record``: the downstream's answer recorded on the effect (``dispatch_apply``) with the tool's result beside
   it, in one transaction: COMMITTED, FAILED (a definite error from the tool) or UNKNOWN (a timeout, a lost
   connection: it may have acted).
4. ``call_reconcile``: an UNKNOWN effect resolved from the rule's query — NOT_OCCURRED makes it PREPARED again, to be
   sent under the same key; OCCURRED makes it COMMITTED.

A repeat of the call — any JSON-RPC id, any connection, this attempt or a later one of the task — lands on the same
effect, so it gets the recorded answer instead of a second send.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings

from claims.digest import canonical_json, digest
from claims.errors import ClaimError
from claims.models import DispatchIntent, DispatchState, Effect, EffectState, Principal
from claims.services import (
    Statement,
    dispatch_apply,
    dispatch_heard,
    dispatch_lost,
    effect_prepare_dispatch,
    effect_reconcile,
    insert_statement,
    prep,
    write,
)

from .. import selectors
from ..models import SlotFrom, ToolCall, ToolKind
from ..selectors import DownstreamConfig, HeldClaim, Rule
from .answers import META_PREFIX, from_error, happened, refusal, replayed

TARGET_SCHEME = "mcp"


@dataclass(frozen=True)
class Call:
    principal: Principal
    claim: HeldClaim
    downstream: DownstreamConfig
    tool: str  # the downstream's own name
    exposed: str  # <prefix>__<tool>
    arguments: dict[str, Any]
    rule: Rule
    slot: str
    payload_digest: str
    claim_generation: int
    scheduler_epoch: int

    @property
    def payload(self) -> dict[str, Any]:
        return {"tool": self.exposed, "arguments": self.arguments}

    @property
    def passes_through(self) -> bool:
        return self.rule.kind == ToolKind.READ_ONLY and not self.rule.record_reads


@dataclass(frozen=True)
class Step:
    kind: str  # ANSWER | SEND | WAIT | RECONCILE
    result: dict[str, Any] | None = None
    effect_id: str = ""
    dispatch_id: str = ""


def _answer(result: dict[str, Any], effect_id: str = "") -> Step:
    return Step("ANSWER", result=result, effect_id=effect_id)


def _meta_value(meta: dict[str, Any] | None, key: str) -> Any:
    return (meta or {}).get(META_PREFIX + key)


def _slot(rule: Rule, exposed: str, arguments: dict[str, Any], given: Any) -> str | dict[str, Any]:
    """The effect slot: the caller's (``_meta`` effect_slot) or the rule's. Hashed into a bounded string; the tool's
    name stays readable in front of it. A refusal body when the rule needs what the call does not give."""
    if given is not None:
        basis: Any = ["caller", str(given)]
    elif rule.slot_from == SlotFrom.CALLER:
        return refusal(
            "INVALID", f"{exposed} needs an effect slot: send it as _meta {META_PREFIX}effect_slot."
        )
    elif rule.slot_from == SlotFrom.ARGUMENT:
        if rule.slot_argument not in arguments:
            return refusal(
                "INVALID", f"{exposed} takes its effect slot from argument {rule.slot_argument!r}."
            )
        basis = ["argument", rule.slot_argument, arguments[rule.slot_argument]]
    else:
        basis = ["canonical", arguments]
    return f"mcp:{exposed[:150]}#{hashlib.sha256(canonical_json(basis)).hexdigest()[:40]}"


def call_plan(
    *,
    principal: Principal,
    attempt_id: uuid.UUID | str | None,
    exposed: str,
    arguments: dict[str, Any] | None,
    meta: dict[str, Any] | None,
    annotations: dict[str, Any] | None = None,
) -> Call | Step:
    """Step 1: the call, resolved — or the refusal that ends it (no such attempt or tool, no slot, arguments that are
    not plain JSON)."""
    arguments = arguments or {}
    try:
        json.dumps(arguments, allow_nan=False)
    except ValueError:
        return _answer(refusal("INVALID", "The arguments must be plain JSON: no NaN or Infinity."))
    size = len(canonical_json(arguments))
    if size > settings.CLAIMS_MAX_VALUE_BYTES:  # the ledger keeps the arguments: no more than the API takes
        return _answer(
            refusal(
                "INVALID",
                f"The arguments are {size} bytes of JSON; at most {settings.CLAIMS_MAX_VALUE_BYTES} "
                "(CLAIMS_MAX_VALUE_BYTES) are taken. Nothing was recorded or sent.",
            )
        )
    named = attempt_id if attempt_id is not None else _meta_value(meta, "attempt_id")
    try:
        attempt_id = uuid.UUID(str(named)) if named is not None else None
    except ValueError:
        return _answer(refusal("INVALID", f"_meta {META_PREFIX}attempt_id is not a UUID."))
    if attempt_id is None:
        return _answer(
            refusal(
                "INVALID",
                "Name the claim this call belongs to: call through /mcp/attempts/{attempt_id}, or send _meta "
                f"{META_PREFIX}attempt_id.",
            )
        )
    claim = selectors.attempt_claim(attempt_id)
    if claim is None:
        return _answer(refusal("NOT_FOUND", f"No attempt {attempt_id}."))
    if claim.owner_id != principal.owner_id:
        return _answer(refusal("FORBIDDEN", f"Attempt {attempt_id} is not {principal.owner_id!r}'s."))
    routed = selectors.route(exposed)
    if routed is None:
        return _answer(refusal("NOT_FOUND", f"No tool {exposed!r}."))
    downstream, tool = routed
    rule = selectors.rule_for(
        downstream.name,
        tool,
        read_only_hint=bool((annotations or {}).get("readOnlyHint")),
        trusted=downstream.trust_annotations,
    )
    slot = _slot(rule, exposed, arguments, _meta_value(meta, "effect_slot"))
    if isinstance(slot, dict):
        return _answer(slot)
    presented = _presented(meta, claim)
    if isinstance(presented, Step):
        return presented
    return Call(
        principal=principal,
        claim=claim,
        downstream=downstream,
        tool=tool,
        exposed=exposed,
        arguments=arguments,
        rule=rule,
        slot=slot,
        payload_digest=digest({"tool": exposed, "arguments": arguments}),
        claim_generation=presented[0],
        scheduler_epoch=presented[1],
    )


def _presented(meta: dict[str, Any] | None, claim: HeldClaim) -> tuple[int, int] | Step:
    """The claim the call presents: the attempt's own, or the values the caller sent in ``_meta`` (whole numbers
    from 0 up; 0 is a value, not an absence)."""
    values: list[int] = []
    for key, held in (
        ("claim_generation", claim.claim_generation),
        ("scheduler_epoch", claim.scheduler_epoch),
    ):
        given = _meta_value(meta, key)
        if given is None:
            values.append(held)
        elif isinstance(given, int) and not isinstance(given, bool) and 0 <= given < 2**63:
            values.append(given)
        else:
            return _answer(
                refusal("INVALID", f"_meta {META_PREFIX}{key} must be a whole number from 0, got {given!r}.")
            )
    return values[0], values[1]


def _claim_kwargs(call: Call) -> dict[str, Any]:
    return {
        "principal": call.principal,
        "attempt_id": call.claim.attempt_id,
        "claim_generation": call.claim_generation,
        "scheduler_epoch": call.scheduler_epoch,
        "owner_id": call.claim.owner_id,
    }


def _keep_call(call: Call, effect: Effect) -> None:
    """The call behind the effect, written once (the first prepare of the slot through the gateway), inside the
    transaction that prepares it — under the effect's row lock, so no other call of the slot writes it meanwhile.
    Kept as it is when it exists already (a send after one whose record is missing); sent with the prepare's other
    writes."""
    write(
        insert_statement(
            ToolCall,
            if_absent=True,
            effect_id=effect.pk,
            namespace_id=effect.namespace_id,
            downstream=call.downstream.name,
            tool=call.tool,
            arguments=call.arguments,
            arguments_digest=call.payload_digest,
            result=None,
            is_error=False,
            sends=0,
            created_at=effect.updated_at,
            answered_at=None,
        )
    )


def _replay(effect: Effect) -> dict[str, Any]:
    recorded = selectors.tool_call(effect.pk)
    if recorded is not None and recorded.result is not None and not recorded.is_error:
        return replayed(recorded.result, effect.pk)
    return happened(effect.pk, effect.external_ref)


def call_begin(call: Call) -> Step:
    """Step 2: bind the effect and, when it may be sent, record the intent to send it — one transaction at the effect
    acceptance point (``effect_prepare_dispatch``; see the module)."""
    if call.passes_through:
        return Step("SEND")
    try:
        prepared = effect_prepare_dispatch(
            task_id=call.claim.task_id,
            effect_slot=call.slot,
            payload=call.payload,
            target=f"{TARGET_SCHEME}://{call.downstream.name}/{call.tool}",
            non_replayable=call.rule.kind == ToolKind.NON_REPLAYABLE,
            inline=True,
            # the first call of the slot (or a send after one whose record is missing): its call, in the same
            # transaction as the effect
            also=lambda effect: _keep_call(call, effect),
            **_claim_kwargs(call),
        )
    except ClaimError as exc:
        return _answer(from_error(exc))
    effect = prepared.effect
    if prepared.outcome == "ALREADY_COMMITTED":
        return _answer(_replay(effect), effect.pk)
    if prepared.outcome == "APPROVAL_REQUIRED":
        return _answer(
            refusal("APPROVAL_REQUIRED", f"Effect {effect.pk} waits for approval.", effect_id=effect.pk),
            effect.pk,
        )
    if prepared.outcome == "RECONCILE_REQUIRED":
        if call.rule.query_tool:
            return Step("RECONCILE", effect_id=effect.pk)
        return _answer(
            refusal("RECONCILE_REQUIRED", f"Effect {effect.pk} is UNKNOWN.", effect_id=effect.pk), effect.pk
        )
    assert prepared.intent is not None
    kind = "SEND" if prepared.recorded else "WAIT"
    return Step(kind, effect_id=effect.pk, dispatch_id=str(prepared.intent.pk))


def call_start(**plan: Any) -> Step | tuple[Call, Step]:
    """Steps 1 and 2 in one go (one hop to the database thread): the refusal, or the call and its first step."""
    call = call_plan(**plan)
    if isinstance(call, Step):
        return call
    return call, call_begin(call)


def call_waited(step: Step) -> Step | None:
    """A call that waited for another call of its slot: that call's answer, when it had one (COMMITTED, or a definite
    FAILED — a duplicate gets the tool's error as its original did, it does not run the tool again). None when it
    ended UNKNOWN or was recorded lost: the caller begins again, and reconciles first."""
    intent = DispatchIntent.objects.filter(pk=step.dispatch_id).values_list("outcome", flat=True).first()
    if intent not in (EffectState.COMMITTED, EffectState.FAILED):
        return None
    recorded = selectors.tool_call(step.effect_id)
    if recorded is None or recorded.result is None:
        return None
    return _answer(replayed(recorded.result, step.effect_id), step.effect_id)


def _kept(result: dict[str, Any] | None) -> tuple[dict[str, Any] | None, str]:
    """The answer as the ledger keeps it: whole, or — over ``CLAIMS_MAX_VALUE_BYTES`` — not at all (the call's caller
    had it; a repeat is told the call happened). Returns it and a note for the effect's reference."""
    if result is None:
        return None, ""
    size = len(canonical_json(result))
    if size <= settings.CLAIMS_MAX_VALUE_BYTES:
        return result, ""
    return None, f" (answer of {size} bytes not kept: over CLAIMS_MAX_VALUE_BYTES)"


def call_record(
    *,
    step: Step,
    state: str,
    result: dict[str, Any] | None,
    external_ref: str,
    error: str = "",
    sent: bool = True,
) -> str:
    """Step 3: the downstream's answer, on the effect and beside it, in one transaction. Returns the delivery's
    outcome (COMMITTED, FAILED, UNKNOWN; SKIPPED when the effect had moved on; NOT_TAKEN when it was recorded
    lost first). ``sent=False``: nothing reached the server (it could not be connected to)."""
    kept, note = _kept(result)

    def keep_answer(effect: Effect, outcome: str, now: datetime) -> None:
        answered = outcome in (EffectState.COMMITTED, EffectState.FAILED)
        write(
            _answer_statement(
                effect.pk,
                now=now,
                sent=sent,
                answer=(kept, outcome == EffectState.FAILED) if answered else None,
            )
        )

    return dispatch_apply(
        dispatch_id=step.dispatch_id,
        state=state,
        external_ref=(external_ref + note)[:500],
        error=error,
        reply=external_ref,
        also=keep_answer,
        sent=sent,
    )


def _answer_statement(
    effect_id: str, *, now: datetime, sent: bool, answer: tuple[dict[str, Any] | None, bool] | None
) -> Statement:
    """The UPDATE of the tool call's answer (``sends`` counted in place), to go with the record's other writes."""
    sets = ["answered_at = %s", "sends = sends + %s"]
    params: list[Any] = [prep(ToolCall, "answered_at", now), int(sent)]
    if answer is not None:
        sets += ["result = %s", "is_error = %s"]
        params += [prep(ToolCall, "result", answer[0]), answer[1]]
    table = ToolCall._meta.db_table
    return Statement(f"UPDATE {table} SET {', '.join(sets)} WHERE effect_id = %s", [*params, effect_id])


def call_heard(step: Step) -> bool:
    """A long call's server reported progress: its sender is alive (``dispatch_heard``)."""
    return dispatch_heard(dispatch_id=step.dispatch_id)


def call_reconcile(call: Call, *, effect_id: str, observed: str, query: str) -> dict[str, Any] | None:
    """Step 4: the rule's query said whether the UNKNOWN call happened. None when recorded; a refusal otherwise (the
    attempt lost its authority meanwhile; another hand reconciled it first is no refusal)."""
    try:
        effect_reconcile(
            effect_id=effect_id, observed=observed, external_ref=query[:500], **_claim_kwargs(call)
        )
    except ClaimError as exc:
        if exc.outcome == "NOT_UNKNOWN":
            return None
        return from_error(exc, effect_id=effect_id)
    return None


def lost_after_seconds(downstream: DownstreamConfig) -> float:
    """How long a sender may stay silent before its call is recorded lost (UNKNOWN): past its own timeout, by a
    margin."""
    return downstream.call_timeout_seconds + settings.MCP_LOST_GRACE_SECONDS


def call_lost(*, step: Step, downstream: DownstreamConfig) -> bool:
    """A call whose sender went silent past its timeout, recorded UNKNOWN (``dispatch_lost``). True when this did
    it."""
    outcome = dispatch_lost(
        dispatch_id=step.dispatch_id,
        silent_for_seconds=lost_after_seconds(downstream),
        why="the gateway's sender went silent past its timeout",
    )
    return outcome not in ("NOT_TAKEN",)


def calls_sweep_lost() -> int:
    """The ``gateway.sweep_lost_calls`` job: every inline intent whose sender is gone (its process died mid-call)
    recorded UNKNOWN, so the drain gate and the console see it without waiting for the slot's next call."""
    configs = {d.name: d for d in selectors.downstreams()}
    swept = 0
    for dispatch_id, target in DispatchIntent.objects.filter(
        inline=True, state=DispatchState.SENDING
    ).values_list("pk", "target")[:500]:
        name = target.removeprefix(f"{TARGET_SCHEME}://").partition("/")[0]
        config = configs.get(name) or DownstreamConfig(name=name, prefix=name, transport="http")
        if call_lost(step=Step("SEND", dispatch_id=str(dispatch_id)), downstream=config):
            swept += 1
    return swept
