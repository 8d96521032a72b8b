"""Rollout: which store decides in each stage, dual writes, and the shadow comparison of winners.

The claim.v1 core is called through its services; the core never imports this module. Where legacy decides
(SHADOW, V1_READS), every operation is judged by both stores and the two verdicts are compared; a disagreement
becomes a ``Mismatch`` (first matching reason of rollout.md's table). Legacy-API operations are mirrored into
claim.v1 as the attempt claim.v1 last granted to that owner on that task, inside ``claims.services.unvalidated``:
they carry no epoch or generation of their own, so they are counted at the acceptance point but not validated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from claims import clock, services
from claims.errors import ClaimError, Conflict, Forbidden, NotFound
from claims.models import Attempt, Namespace, Principal, Stage, Task, TaskState

from .legacy import LegacyVerdict, legacy_store
from .models import ComparedOperation, ExplainRule, Mismatch, MismatchReason, MismatchStatus

LEGACY_DECIDES = (Stage.SHADOW, Stage.V1_READS)
V1_DECIDES = (Stage.V1_WRITES, Stage.V1_ONLY)
_STALE_WORDS = {"FENCED", "CANCELLED", "STALE_INPUT"}


class ProtocolTooOld(Conflict):
    outcome = "PROTOCOL_TOO_OLD"


class StageNotOpen(Conflict):
    outcome = "STAGE_NOT_OPEN"


class LegacyRefused(Conflict):
    """Legacy's own refusal words (HELD, NOT_OWNER) on the legacy API, or where legacy decides."""

    def __init__(self, word: str, detail: str, body: dict[str, Any]):
        super().__init__(detail, reason=word)
        self.outcome = word
        self.extra = body

    def body(self) -> dict[str, Any]:
        return {**self.extra, "outcome": self.outcome, "reason": self.reason, "detail": self.detail}


@dataclass
class V1Verdict:
    accepted: bool
    word: str
    reason: str = ""
    attempt_id: str | None = None
    claim_generation: int | None = None
    body: dict[str, Any] = field(default_factory=dict)

    def as_record(self) -> dict[str, Any]:
        return {
            "verdict": self.word,
            "reason": self.reason,
            "attempt_id": self.attempt_id,
            "claim_generation": self.claim_generation,
        }


def namespace_of(task_id: str) -> Namespace:
    task = Task.objects.select_related("namespace").filter(pk=task_id).first()
    if task is None:
        raise NotFound("no such task")
    return task.namespace


def record_legacy(
    ns: Namespace, task_id: str, operation: str, api: str, owner_id: str, verdict: LegacyVerdict, now
) -> None:
    """Append the legacy decision to the task's legacy history, in the decision's transaction."""
    from .models import LegacyEvent

    LegacyEvent.objects.create(
        namespace=ns.name,
        task_id=task_id,
        operation=operation,
        api=api,
        owner_id=owner_id,
        verdict=verdict.word,
        accepted=verdict.accepted,
        at=now,
    )


def _refuse_refused_worker(principal: Principal, ns: Namespace) -> None:
    from .models import WorkerRegistration

    if WorkerRegistration.objects.filter(principal=principal.name, namespace=ns.name, refused=True).exists():
        raise ProtocolTooOld(
            "this worker registered with a protocol the namespace refuses; register again",
            current={"stage": ns.stage},
        )


# --- reviews ---------------------------------------------------------------------------------------------


def mismatch_review(*, principal: Principal, mismatch_id: int, status: str, note: str) -> Mismatch:
    """A reviewer marks a mismatch EXPLAINED (with a note) or BUG; a BUG is re-marked EXPLAINED once fixed."""
    from claims.errors import Invalid
    from claims.services._base import audit

    if status == MismatchStatus.EXPLAINED and not note.strip():
        raise Invalid({"note": ["An explanation needs a note."]})
    with transaction.atomic(durable=True):
        mismatch = Mismatch.objects.select_for_update().filter(pk=mismatch_id).first()
        if mismatch is None:
            raise NotFound("no such mismatch")
        mismatch.status, mismatch.note, mismatch.reviewed_by = status, note, principal.name
        mismatch.save(update_fields=["status", "note", "reviewed_by"])
        audit(
            principal=principal,
            action="mismatch_review",
            at=clock.now(),
            namespace=mismatch.namespace,
            target=str(mismatch_id),
            reason=note,
            detail={"status": status, "reason": mismatch.reason},
        )
    return mismatch


def explain_rule_create(*, principal: Principal, namespace: str, reason: str, note: str) -> ExplainRule:
    """Mark future mismatches of ``reason`` EXPLAINED as they arrive (recorded as explained by this rule)."""
    from claims.services._base import audit

    if not Namespace.objects.filter(name=namespace).exists():
        raise NotFound(f"no such namespace: {namespace}")
    with transaction.atomic(durable=True):
        now = clock.now()
        rule = ExplainRule.objects.create(
            namespace=namespace, reason=reason, note=note, created_by=principal.name, created_at=now
        )
        audit(
            principal=principal,
            action="explain_rule_create",
            at=now,
            namespace=namespace,
            target=reason,
            reason=note,
        )
    return rule


# --- comparison ----------------------------------------------------------------------------------------


def _v1_live_other_owner(task_id: str, owner_id: str) -> bool:
    task = Task.objects.select_related("namespace").filter(pk=task_id).first()
    return bool(
        task
        and task.state == TaskState.CLAIMED
        and task.owner_id != owner_id
        and task.lease_expires_at > clock.now()
        and task.scheduler_epoch == task.namespace.scheduler_epoch
    )


def mismatch_reason(
    operation: str, legacy: LegacyVerdict, v1: V1Verdict, *, task_id: str, owner_id: str
) -> str | None:
    """The first row of rollout.md's table that matches, or None when the stores agree."""
    if operation == "claim":
        if legacy.accepted and not v1.accepted and _v1_live_other_owner(task_id, owner_id):
            return MismatchReason.DOUBLE_GRANT
        if not legacy.accepted and legacy.word == "HELD" and v1.accepted:
            return MismatchReason.DOUBLE_GRANT
    if (
        operation in ("commit", "complete")
        and legacy.accepted
        and not v1.accepted
        and v1.word in _STALE_WORDS
    ):
        return MismatchReason.STALE_COMMIT_ACCEPTED
    if legacy.accepted and not v1.accepted:
        return MismatchReason.V1_REJECTED_ONLY
    if not legacy.accepted and v1.accepted:
        return MismatchReason.LEGACY_REJECTED_ONLY
    if operation in ("commit", "complete") and legacy.accepted and v1.accepted:
        row = legacy_store().get(task_id=task_id)
        canonical = Task.objects.filter(pk=task_id).values_list("result_digest", flat=True).first()
        if row is not None and canonical and row.result_digest != canonical:
            return MismatchReason.WINNER_DIFFERS
    return None


def compare(
    *,
    namespace: str,
    task_id: str,
    operation: str,
    api: str,
    owner_id: str,
    legacy: LegacyVerdict,
    v1: V1Verdict,
) -> Mismatch | None:
    """Record the comparison (it counts toward the SHADOW → V1_READS gate) and, on disagreement, the mismatch —
    EXPLAINED at once when an explain rule covers its reason."""
    reason = mismatch_reason(operation, legacy, v1, task_id=task_id, owner_id=owner_id)
    with transaction.atomic(durable=True):
        now = clock.now()
        ComparedOperation.objects.create(
            namespace=namespace, operation=operation, api=api, agreed=reason is None, at=now
        )
        if reason is None:
            return None
        rule = ExplainRule.objects.filter(namespace=namespace, reason=reason).order_by("-id").first()
        return Mismatch.objects.create(
            namespace=namespace,
            task_id=task_id,
            operation=operation,
            api=api,
            legacy={"verdict": legacy.word, "owner_id": legacy.owner_id or owner_id},
            v1=v1.as_record(),
            reason=reason,
            status=MismatchStatus.EXPLAINED if rule else MismatchStatus.OPEN,
            note=rule.note if rule else "",
            explained_by_rule=rule,
            at=now,
        )


# --- judging in claim.v1 -------------------------------------------------------------------------------


def judge(call, *, accepted_word: str) -> V1Verdict:
    """Run one claim.v1 service call and turn its answer into a verdict (a rejection is a verdict, not an error)."""
    try:
        value = call()
    except Conflict as exc:
        return V1Verdict(False, exc.outcome, exc.reason, body=exc.body())
    except (NotFound, Forbidden, ClaimError) as exc:
        return V1Verdict(False, exc.outcome, getattr(exc, "reason", exc.outcome))
    attempt_id = getattr(value, "attempt_id", None)
    generation = getattr(getattr(value, "task", value), "claim_generation", None)
    return V1Verdict(
        True,
        accepted_word,
        attempt_id=str(attempt_id) if attempt_id else None,
        claim_generation=generation,
        body={"value": value},
    )


def last_attempt(task_id: str, owner_id: str) -> Attempt | None:
    return Attempt.objects.filter(task_id=task_id, owner_id=owner_id).order_by("-claim_generation").first()


def _mirror(
    operation: str,
    *,
    principal: Principal,
    task_id: str,
    ns: Namespace,
    ttl_seconds: int = 30,
    result: Any = None,
    result_digest: str = "",
) -> V1Verdict:
    """A legacy-API operation judged by claim.v1, not validated (it carries no epoch or generation)."""
    with services.unvalidated():
        if operation == "claim":
            return judge(
                lambda: services.task_claim(
                    principal=principal,
                    task_id=task_id,
                    owner_id=principal.owner_id,
                    scheduler_epoch=ns.scheduler_epoch,
                    ttl_seconds=ttl_seconds,
                ),
                accepted_word="CLAIMED",
            )
        attempt = last_attempt(task_id, principal.owner_id)
        if attempt is None:
            return V1Verdict(False, "FENCED", "ATTEMPT")
        common = {
            "principal": principal,
            "task_id": task_id,
            "attempt_id": attempt.attempt_id,
            "claim_generation": attempt.claim_generation,
        }
        if operation == "heartbeat":
            return judge(
                lambda: services.task_renew(
                    **common,
                    owner_id=principal.owner_id,
                    scheduler_epoch=attempt.scheduler_epoch,
                    cancel_generation=attempt.cancel_generation,
                    extend_seconds=ttl_seconds,
                ),
                accepted_word="RENEWED",
            )
        if operation == "release":
            return judge(
                lambda: services.task_release(
                    **common, owner_id=principal.owner_id, scheduler_epoch=attempt.scheduler_epoch
                ),
                accepted_word="RELEASED",
            )
        # complete → stage + commit of that attempt, with the values current when it was granted
        judge(
            lambda: services.result_stage(**common, result=result, result_digest=result_digest),
            accepted_word="STAGED",
        )
        return judge(
            lambda: services.task_commit(
                **common,
                scheduler_epoch=attempt.scheduler_epoch,
                observed_cancel_generation=attempt.cancel_generation,
                input_digest=attempt.input_digest,
                result_digest=result_digest,
            ),
            accepted_word="COMMITTED",
        )


# --- the legacy API --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LegacyAnswer:
    verdict: LegacyVerdict
    mismatch: Mismatch | None = None


def legacy_operation(
    operation: str,
    *,
    principal: Principal,
    task_id: str,
    owner_id: str,
    ttl_seconds: int = 30,
    result: Any = None,
    result_digest: str = "",
) -> LegacyAnswer:
    """Serve a legacy-API request (claim, heartbeat, release, complete) as the namespace's stage says:
    LEGACY — the legacy store only; SHADOW/V1_READS — legacy decides, claim.v1 judges the mirror, both are
    compared; V1_WRITES/V1_ONLY — refused: old binaries may not return (PROTOCOL_TOO_OLD)."""
    ns = namespace_of(task_id)  # 404 before the owner's 403 (claim-v1.md §2)
    if owner_id != principal.owner_id:
        raise Forbidden(f"this token acts as {principal.owner_id!r}, not {owner_id!r}")
    _refuse_refused_worker(principal, ns)
    if ns.stage in V1_DECIDES:
        raise ProtocolTooOld(
            f"namespace {ns.name} is at {ns.stage}: the legacy protocol is closed",
            current={"stage": ns.stage},
        )
    store = legacy_store()
    with transaction.atomic(durable=True):
        now = clock.now()
        if operation == "claim":
            if ns.claims_paused:  # a paused namespace grants no claim, legacy API included
                from claims.errors import ClaimsPaused

                raise ClaimsPaused(
                    f"claims are paused in namespace {ns.name}",
                    current={"scheduler_epoch": ns.scheduler_epoch, "claims_paused": True},
                )
            verdict = store.claim(
                task_id=task_id,
                namespace=ns.name,
                owner_id=owner_id,
                ttl_seconds=ttl_seconds,
                now=now,
                pool=principal.pool,
            )
        elif operation == "heartbeat":
            verdict = store.heartbeat(task_id=task_id, owner_id=owner_id, ttl_seconds=ttl_seconds, now=now)
        elif operation == "release":
            verdict = store.release(task_id=task_id, owner_id=owner_id, now=now)
        else:
            verdict = store.complete(
                task_id=task_id,
                namespace=ns.name,
                owner_id=owner_id,
                result=result,
                result_digest=result_digest,
                now=now,
            )
        record_legacy(ns, task_id, operation, "legacy", owner_id, verdict, now)
    if ns.stage not in LEGACY_DECIDES:
        return LegacyAnswer(verdict)
    v1 = _mirror(
        operation,
        principal=principal,
        task_id=task_id,
        ns=ns,
        ttl_seconds=ttl_seconds,
        result=result,
        result_digest=result_digest,
    )
    mismatch = compare(
        namespace=ns.name,
        task_id=task_id,
        operation=operation,
        api="legacy",
        owner_id=owner_id,
        legacy=verdict,
        v1=v1,
    )
    return LegacyAnswer(verdict, mismatch)


# --- the claim.v1 API, routed by stage -------------------------------------------------------------------


@dataclass(frozen=True)
class Routed:
    status: int
    body: dict[str, Any]


def _epoch_rule_first(ns: Namespace, *, scheduler_epoch: int, attempt_id: Any = None) -> bool:
    """The epoch rule holds in every stage, before legacy is asked: an old carried epoch, or an attempt granted
    before a fence, goes to the core, which refuses it (FENCED, EPOCH) and counts the rejection. So does a claim
    while claims are paused (CLAIMS_PAUSED): a paused namespace grants no claim through either API."""
    if scheduler_epoch != ns.scheduler_epoch:
        return True
    if attempt_id is None and ns.claims_paused:
        return True
    if attempt_id is not None:
        granted = Attempt.objects.filter(pk=attempt_id).values_list("scheduler_epoch", flat=True).first()
        return granted is not None and granted != ns.scheduler_epoch
    return False


def _v1_fields(task_id: str, v1: V1Verdict) -> dict[str, Any]:
    task = Task.objects.get(pk=task_id)
    granted = v1.accepted and v1.word == "CLAIMED"
    value = v1.body.get("value")
    return {
        "task_id": task.task_id,
        "input": task.input,
        "input_digest": task.input_digest,
        "state_version": task.state_version,
        "attempt_id": v1.attempt_id if granted else None,
        "scheduler_epoch": task.scheduler_epoch if granted else None,
        "claim_generation": task.claim_generation if granted else None,
        "cancel_generation": task.cancel_generation,
        "lease_expires_at": task.lease_expires_at.isoformat() if granted and task.lease_expires_at else None,
        "fences": getattr(value, "fences", {}) if granted else {},
    }


def routed_v1(
    operation: str,
    *,
    principal: Principal,
    task_id: str,
    v1_call,
    legacy_call,
    attempt_id: Any = None,
    scheduler_epoch: int,
    owner_id: str,
    success_word: str,
    v1_write_through=None,
    core_refuses: bool = False,
) -> Routed | None:
    """Route one claim.v1 request (claim, renew, release, commit) by the namespace's stage.

    Returns None when the core alone answers (V1_ONLY, or an epoch-rule refusal in any stage: the caller then
    calls the core view). LEGACY: STAGE_NOT_OPEN. V1_WRITES: the core decides and its decision is written to the
    legacy store too (``v1_write_through``), for rollback. SHADOW/V1_READS: legacy decides; claim.v1 judges in
    shadow; the verdicts are compared; the answer carries legacy's verdict, the shadow attempt's claim.v1 fields
    (null where claim.v1 refused), ``decided_by: "legacy"`` and ``shadow: {verdict, reason, mismatch_id}``.
    """
    ns = namespace_of(task_id)  # 404 before the owner's 403 (claim-v1.md §2)
    if owner_id != principal.owner_id:
        raise Forbidden(f"this token acts as {principal.owner_id!r}, not {owner_id!r}")
    # Who may act is decided before any store is asked, in every stage: the attempt named must be one of this
    # task's and the caller's own (403 otherwise). An attempt that does not exist goes to the core, which
    # refuses it (FENCED, ATTEMPT) — legacy, whose complete is unconditional, is never asked on its behalf.
    if attempt_id is not None:
        owner = (
            Attempt.objects.filter(pk=attempt_id, task_id=task_id).values_list("owner_id", flat=True).first()
        )
        if owner is None:
            return None
        if owner != principal.owner_id:
            raise Forbidden(f"attempt {attempt_id} is not {principal.owner_id!r}'s")
    _refuse_refused_worker(principal, ns)
    if ns.stage == Stage.V1_ONLY or _epoch_rule_first(
        ns, scheduler_epoch=scheduler_epoch, attempt_id=attempt_id
    ):
        return None
    if ns.stage == Stage.LEGACY:
        raise StageNotOpen(
            f"namespace {ns.name} is at LEGACY: the claim.v1 API is not open yet", current={"stage": ns.stage}
        )
    if core_refuses and ns.stage in LEGACY_DECIDES:
        # Legacy would decide on nothing (a commit whose attempt staged no such result): the core answers, and it
        # can only refuse.
        return None
    if ns.stage == Stage.V1_WRITES:
        value = v1_call()
        if v1_write_through is not None:
            with transaction.atomic(durable=True):
                v1_write_through(legacy_store(), ns, clock.now(), value)
        return Routed(-1, {"value": value})  # the caller shapes the core's own answer
    with transaction.atomic(durable=True):
        now = clock.now()
        verdict = legacy_call(legacy_store(), ns, now)
        record_legacy(ns, task_id, operation, "claim.v1", owner_id, verdict, now)
    v1 = judge(v1_call, accepted_word=success_word)
    mismatch = compare(
        namespace=ns.name,
        task_id=task_id,
        operation=operation,
        api="claim.v1",
        owner_id=owner_id,
        legacy=verdict,
        v1=v1,
    )
    body = {
        **_v1_fields(task_id, v1),
        "decided_by": "legacy",
        "shadow": {
            "verdict": v1.word,
            "reason": v1.reason or v1.word,
            "mismatch_id": mismatch.id if mismatch else None,
        },
    }
    if verdict.accepted:
        extra = {}
        if operation == "commit" and v1.accepted:
            committed = v1.body["value"]
            extra = {"result_commit_id": str(committed.result_commit_id), "unblocked": committed.unblocked}
        if operation == "renew":
            extra = {"lease_expires_at": verdict.expires_at.isoformat() if verdict.expires_at else None}
        return Routed(200, {"outcome": success_word, **body, **extra})
    return Routed(
        409,
        {
            "outcome": verdict.word,
            "reason": verdict.word,
            "detail": f"legacy refused: {verdict.word}",
            "current": {
                "owner_id": verdict.owner_id,
                "expires_at": verdict.expires_at.isoformat() if verdict.expires_at else None,
            },
            **body,
        },
    )
