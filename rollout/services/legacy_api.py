"""The legacy protocol's API (claim, heartbeat, release, complete), served as the namespace's stage says.

LEGACY: the legacy store alone. SHADOW/V1_READS: legacy decides; the operation is mirrored into claim.v1 as the
attempt claim.v1 last granted to that owner on that task — passed on ``acting_via("legacy")``, so the core's
timeline says where it came from and coverage counts it as not validated (it carries no epoch or generation of
its own) — and the two verdicts are compared. V1_WRITES/V1_ONLY: refused, old binaries may not return.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from claims import interleave
from claims import services as core
from claims.errors import ClaimsPaused, Fenced, Forbidden, InvalidTransition
from claims.models import Attempt, Principal

from ..legacy import LegacyVerdict, legacy_unit
from ..models import Mismatch
from . import routing
from .deciding import Target, legacy_decides, legacy_decision, namespace_of
from .errors import LegacyRefused, ProtocolTooOld
from .operations import LEGACY, Ask, Mirrored, TaskOperation, V1Verdict
from .shadow import Records, accepted, compare, judged
from .state import stage_for
from .workers import protocol_too_old


@dataclass(frozen=True)
class LegacyAnswer:
    verdict: LegacyVerdict
    mismatch: Mismatch | None = None


def last_attempt(task_id: str, owner_id: str) -> Attempt | None:
    """The attempt claim.v1 last granted this owner on the task: what a legacy request of that owner names."""
    return Attempt.objects.filter(task_id=task_id, owner_id=owner_id).order_by("-claim_generation").first()


def _mirrored(each: TaskOperation, ask: Ask, scheduler_epoch: int) -> V1Verdict:
    """The legacy operation judged by claim.v1 (the operation's own mirror), as the attempt it last granted this
    owner; passed on ``acting_via("legacy")``."""
    attempt = None if each.claims else last_attempt(ask.task_id, ask.principal.owner_id)
    mirrored = Mirrored(
        ask.principal, ask.task_id, ask.principal.owner_id, scheduler_epoch, ask.ttl_seconds, attempt,
        ask.result, ask.result_digest,
    )  # fmt: skip
    with core.acting_via(LEGACY):
        return judged(lambda: each.mirror(mirrored), accepted_word=each.accepted)


def legacy_operation(
    each: TaskOperation,
    *,
    principal: Principal,
    task_id: str,
    owner_id: str,
    ttl_seconds: int = 30,
    result: Any = None,
    result_digest: str = "",
    reroutes: int = 3,
) -> LegacyAnswer:
    """Serve one legacy-API request (``each``: a row of ``operations.LEGACY_OPERATIONS``): legacy's accepted
    verdict (and the mismatch, if the stores disagreed), or its refusal as LegacyRefused (409 with its own word).
    Legacy decides where the routing has it decide (``deciding.legacy_decides``); claim.v1 then judges the same
    request in shadow."""
    target = namespace_of(task_id, principal)  # 404 before the owner's 403 (claim-v1.md §2)
    if owner_id != principal.owner_id:
        raise Forbidden(f"this token acts as {principal.owner_id!r}, not {owner_id!r}")
    ns = target.namespace
    if target.protocol_refused:
        raise protocol_too_old(target.stage)
    if target.stage in routing.V1_DECIDES:
        raise ProtocolTooOld(
            f"namespace {ns.name} is at {target.stage}: the legacy protocol is closed",
            current={"stage": target.stage},
        )
    if each.claims and ns.claims_paused:  # a paused namespace grants no claim, legacy API included
        raise ClaimsPaused(
            f"claims are paused in namespace {ns.name}",
            current={"scheduler_epoch": ns.scheduler_epoch, "claims_paused": True},
        )
    interleave.reach("legacy_operation.routed")
    ask = Ask(principal, task_id, ns.name, owner_id, LEGACY, ttl_seconds, result, result_digest)
    if target.stage in routing.LEGACY_DECIDES:
        answer = _in_shadow(each, ask, target)
    else:  # LEGACY: legacy alone
        verdict = legacy_decides(each, ask, target, lambda verdict, records: verdict)
        answer = LegacyAnswer(verdict) if verdict is not None else None
    if answer is None:  # an advance, a rollback or a fence landed meanwhile: through the routing again
        if reroutes == 0:
            raise InvalidTransition(
                "the namespace's stage kept moving under this request: send it again", reason="STAGE_CHANGED"
            )
        return legacy_operation(
            each,
            principal=principal,
            task_id=task_id,
            owner_id=owner_id,
            ttl_seconds=ttl_seconds,
            result=result,
            result_digest=result_digest,
            reroutes=reroutes - 1,
        )
    return _answered(answer)


class _StageMoved(Exception):
    """The stage changed between the routing and the decision's lock (rolls the decision back; routed again)."""


class _LegacyDecides(core.Guard):
    """Legacy's decision made inside the transaction of claim.v1's judgement of the same request — after it, under
    the task's lock — with legacy's history and the comparison: a second request on the task waits for the first
    to be decided in both stores, so claim.v1 judges them in the order legacy decided them."""

    def __init__(self, each: TaskOperation, ask: Ask, target: Target):
        self.each, self.ask, self.target = each, ask, target
        self.answer: LegacyAnswer | None = None

    def check(self, point: str, ns: core.NamespaceHold) -> None:
        if stage_for(ns, self.ask.principal)[0] != self.target.stage:
            raise _StageMoved()

    def settle(self, point: str, ns: core.NamespaceHold, value: Any) -> None:
        if self.answer is not None:  # a complete's stage, then its commit: the commit settles
            return
        records = Records()
        verdict = legacy_decision(self.each, self.ask, records)
        interleave.reach("legacy_operation.decided")
        v1 = accepted(value, self.each.accepted)
        self.answer = LegacyAnswer(verdict, _compared(self.each, self.ask, verdict, v1, records))
        records.send()


def _in_shadow(each: TaskOperation, ask: Ask, target: Target) -> LegacyAnswer | None:
    """SHADOW, V1_READS: claim.v1 judges the request as the attempt it last granted this owner; legacy decides in
    that decision's transaction (``_LegacyDecides``). Where claim.v1 refuses, its transaction rolled back and legacy
    decides in one of its own, compared there with the refusal. None: the stage moved."""
    hook = _LegacyDecides(each, ask, target)
    try:
        with legacy_unit(), core.guarded(hook):
            v1 = _mirrored(each, ask, target.namespace.scheduler_epoch)
    except _StageMoved:
        return None
    if v1.accepted and hook.answer is not None:
        return hook.answer
    if each.needs_live_lease and (v1.word, v1.reason) == ("FENCED", "EPOCH"):
        # A fence is a fence in every stage: this owner's lease was granted before the namespace's last epoch
        # fence (claim.v1's attempt for it is of an older epoch), so legacy is not asked to extend it or to take
        # its result — refused as claim.v1 refuses it, whatever legacy's own expiry says. A release is let
        # through: it ends legacy's lease too, which is what the drain waits for.
        raise Fenced(
            f"this lease was granted before an epoch fence (the namespace is at epoch "
            f"{target.namespace.scheduler_epoch}): claim the task again",
            reason="EPOCH",
        )
    return legacy_decides(
        each,
        ask,
        target,
        lambda verdict, records: LegacyAnswer(verdict, _compared(each, ask, verdict, v1, records)),
    )


def _compared(
    each: TaskOperation, ask: Ask, verdict: LegacyVerdict, v1: V1Verdict, records: Records
) -> Mismatch | None:
    return compare(ask, each, verdict, v1, records=records)  # a legacy-API ask: its api is LEGACY


def _answered(answer: LegacyAnswer) -> LegacyAnswer:
    """Legacy's verdict is the answer; its refusal (HELD, NOT_OWNER) is the typed 409, raised once every record
    of the operation — legacy's history, the comparison, a mismatch — is written."""
    verdict = answer.verdict
    if not verdict.accepted:
        held = {"owner_id": verdict.owner_id, "expires_at": verdict.expires_at}
        raise LegacyRefused(
            verdict.word,
            "another owner holds the claim" if verdict.word == "HELD" else "the claim names another owner",
            current=held,
            extra=held,
        )
    return answer
