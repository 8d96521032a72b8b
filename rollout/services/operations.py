"""One task's operation as both stores see it (``TaskOperation``): four rows — claim, renew, release, commit —
each a small typed description of what the legacy store is asked, how claim.v1's decision is written through to
it (V1_WRITES), how a legacy operation is asked of claim.v1 (the mirror, for the legacy API and observe mode), and
the words each store accepts with. The routing (``routing.py``), the legacy API (``legacy_api.py``), observe mode
and the comparison (``shadow.py``) read these rows; none holds an operation's name. The claim.v1 endpoints that
decide them are the rows of ``routes.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Any

from claims import services as core
from claims.errors import ClaimError, Fenced
from claims.models import Attempt, Principal, Task

from ..legacy import LegacyAsk, LegacyStore, LegacyVerdict, decide
from .inputs import Input

CLAIM_V1 = "claim.v1"
LEGACY = "legacy"


@dataclass(frozen=True)
class Ask:
    """One task's request in the terms both stores understand."""

    principal: Principal
    task_id: str
    namespace: str
    owner_id: str
    api: str  # which API the worker called: CLAIM_V1 or LEGACY
    ttl_seconds: int = 30
    result: Any = None
    result_digest: str = ""


@dataclass(frozen=True)
class V1Verdict:
    """claim.v1's judgement of one operation: accepted with the core's value, or refused with its word."""

    accepted: bool
    word: str
    reason: str = ""
    attempt_id: str | None = None
    claim_generation: int | None = None
    value: Any = None

    def as_record(self) -> dict[str, Any]:
        return {
            "verdict": self.word,
            "reason": self.reason,
            "attempt_id": self.attempt_id,
            "claim_generation": self.claim_generation,
        }


def refused(exc: ClaimError) -> V1Verdict:
    return V1Verdict(False, exc.outcome, exc.reason)


@dataclass(frozen=True)
class Mirrored:
    """A legacy operation as claim.v1 is asked it: as the owner, naming the attempt claim.v1 last granted that
    owner on the task (``attempt``; a claim names none). ``staged``: a complete is mirrored as legacy's API sends it
    — the result staged, then committed as of the attempt; else (observe mode) committed inline as of the task's
    input now, which is what the row's writer last saw."""

    principal: Principal
    task_id: str
    owner_id: str
    scheduler_epoch: int  # the namespace's: what a mirrored claim carries
    ttl_seconds: int
    attempt: Attempt | None = None
    result: Any = None
    result_digest: str = ""
    staged: bool = True


@dataclass(frozen=True)
class TaskOperation:
    """One task's operation, as both stores see it.

    ``name`` is how legacy's history and the comparisons record it; ``accepted`` claim.v1's word when it accepts,
    ``legacy_word`` legacy's when an observed change shows it decided. ``asked`` is what the legacy store is asked,
    ``written`` how claim.v1's decision (its value) is written through to it in V1_WRITES — each a ``LegacyAsk``
    the store decides with others at once (``legacy.decide``). ``mirror`` is claim.v1's own call for the legacy
    operation (a refusal raised as the core's ``ClaimError``). ``extras``: what an accepted answer where legacy
    decided adds to claim.v1's view of the task.

    What sets the operations apart, as data: ``claims`` — its gate is the carried epoch and the pause; ``commits``
    — legacy is asked only with a result to complete with; ``sets_expiry`` — legacy's row afterwards carries the
    owner's lease; ``needs_live_lease`` — under a lease a fence ended, legacy is not asked at all (a heartbeat
    would extend it, a complete would take its result; a release is let through: it ends legacy's lease too)."""

    name: str
    accepted: str
    legacy_word: str
    asked: Callable[[Ask], LegacyAsk]
    written: Callable[[Ask, Any], LegacyAsk]
    mirror: Callable[[Mirrored], Any]
    extras: Callable[[V1Verdict, LegacyVerdict], dict[str, Any]] = lambda v1, verdict: {}
    claims: bool = False
    commits: bool = False
    sets_expiry: bool = False
    needs_live_lease: bool = False

    def ask(self, store: LegacyStore, ask: Ask) -> LegacyVerdict:
        return decide(store, [self.asked(ask)])[0]

    def verdict(self, value: Any) -> V1Verdict:
        """claim.v1's accepted verdict on this operation, from the core's answer."""
        task = getattr(value, "task", value)
        attempt_id = getattr(value, "attempt_id", None)
        generation = getattr(task, "claim_generation", None)
        return V1Verdict(
            True,
            self.accepted,
            attempt_id=str(attempt_id) if attempt_id else None,
            claim_generation=generation,
            value=value,
        )


def _claim(ask: Ask) -> LegacyAsk:
    fields = {"namespace": ask.namespace, "owner_id": ask.owner_id, "ttl_seconds": ask.ttl_seconds}
    return LegacyAsk("claim", {"task_id": ask.task_id, **fields, "pool": ask.principal.pool, "via": ask.api})


def _heartbeat(ask: Ask) -> LegacyAsk:
    return LegacyAsk(
        "heartbeat", {"task_id": ask.task_id, "owner_id": ask.owner_id, "ttl_seconds": ask.ttl_seconds}
    )


def _release(ask: Ask) -> LegacyAsk:
    return LegacyAsk("release", {"task_id": ask.task_id, "owner_id": ask.owner_id})


def _complete(ask: Ask) -> LegacyAsk:
    fields = {"namespace": ask.namespace, "owner_id": ask.owner_id, "result": ask.result}
    return LegacyAsk(
        "complete", {"task_id": ask.task_id, **fields, "result_digest": ask.result_digest, "via": ask.api}
    )


def _held_by(ask: Ask, value: Any) -> LegacyAsk:
    """A claim or renew claim.v1 granted: the legacy row names its owner and expiry."""
    task: Task = getattr(value, "task", value)
    fields = {
        "namespace": ask.namespace,
        "owner_id": task.owner_id or "",
        "expires_at": task.lease_expires_at,
    }
    return LegacyAsk("record", {"task_id": ask.task_id, **fields, "pool": ask.principal.pool})


def _let_go(ask: Ask, value: Any) -> LegacyAsk:
    return LegacyAsk(
        "record", {"task_id": ask.task_id, "namespace": ask.namespace, "owner_id": "", "expires_at": None}
    )


def _completed(ask: Ask, value: Any) -> LegacyAsk:
    """A commit claim.v1 accepted: legacy's row completed with the canonical result."""
    fields = {"namespace": ask.namespace, "owner_id": ask.principal.owner_id, "result": value.result}
    return LegacyAsk(
        "complete", {"task_id": ask.task_id, **fields, "result_digest": value.result_digest, "via": CLAIM_V1}
    )


def _as_attempt(m: Mirrored) -> tuple[Attempt, dict[str, Any]]:
    """The owner's last attempt, and the fields every mirrored call names it by (its id and generation)."""
    if m.attempt is None:
        raise Fenced("claim.v1 granted this owner no attempt on the task", reason="ATTEMPT")
    attempt = m.attempt
    named = {"principal": m.principal, "task_id": m.task_id, "attempt_id": attempt.attempt_id}
    return attempt, {**named, "claim_generation": attempt.claim_generation}


def _claim_mirrored(m: Mirrored) -> Any:
    fields: dict[str, Any] = {
        "owner_id": m.owner_id,
        "scheduler_epoch": m.scheduler_epoch,
        "ttl_seconds": m.ttl_seconds,
    }
    return core.task_claim(principal=m.principal, task_id=m.task_id, **fields)


def _renew_mirrored(m: Mirrored) -> Any:
    attempt, named = _as_attempt(m)
    lease: dict[str, Any] = {"cancel_generation": attempt.cancel_generation, "extend_seconds": m.ttl_seconds}
    return core.task_renew(**named, owner_id=m.owner_id, scheduler_epoch=attempt.scheduler_epoch, **lease)


def _release_mirrored(m: Mirrored) -> Any:
    attempt, named = _as_attempt(m)
    return core.task_release(**named, owner_id=m.owner_id, scheduler_epoch=attempt.scheduler_epoch)


def _commit_mirrored(m: Mirrored) -> Any:
    """Legacy's complete as claim.v1's commit of the owner's attempt, with the values current when it was granted.
    Staged first where legacy's API asked (a refused stage is the commit's to answer: it finds nothing staged)."""
    attempt, named = _as_attempt(m)
    if m.staged:
        with suppress(ClaimError):
            core.result_stage(**named, result=m.result, result_digest=m.result_digest)
        inline: dict[str, Any] = {"input_digest": attempt.input_digest}
    else:
        inline = {"input_digest": Task.objects.get(pk=m.task_id).input_digest, "result": m.result}
    return core.task_commit(
        **named,
        scheduler_epoch=attempt.scheduler_epoch,
        observed_cancel_generation=attempt.cancel_generation,
        result_digest=m.result_digest,
        **inline,
    )


def _renew_extras(v1: V1Verdict, verdict: LegacyVerdict) -> dict[str, Any]:
    """A renew's expiry as legacy set it."""
    return {"lease_expires_at": verdict.expires_at}


def _commit_extras(v1: V1Verdict, verdict: LegacyVerdict) -> dict[str, Any]:
    """A commit's ids, where claim.v1 committed too."""
    if not v1.accepted:
        return {}
    extra = {"result_commit_id": v1.value.result_commit_id, "unblocked": v1.value.unblocked}
    if v1.value.staged_result_id is not None:
        extra["staged_result_id"] = v1.value.staged_result_id
    return extra


CLAIM = TaskOperation(
    "claim", "CLAIMED", "GRANTED", _claim, _held_by, _claim_mirrored, claims=True, sets_expiry=True
)
RENEW = TaskOperation(
    "renew", "RENEWED", "RENEWED", _heartbeat, _held_by, _renew_mirrored, _renew_extras,
    sets_expiry=True, needs_live_lease=True,
)  # fmt: skip
RELEASE = TaskOperation("release", "RELEASED", "RELEASED", _release, _let_go, _release_mirrored)
COMMIT = TaskOperation(
    "commit", "COMMITTED", "COMPLETED", _complete, _completed, _commit_mirrored, _commit_extras,
    commits=True, needs_live_lease=True,
)  # fmt: skip

# The legacy protocol's own operations: the same decisions, under the names legacy's binaries use.
HEARTBEAT = replace(RENEW, name="heartbeat")
COMPLETE = replace(COMMIT, name="complete")
LEGACY_OPERATIONS = {
    each.name: each for each in (CLAIM, HEARTBEAT, RELEASE, COMPLETE)
}  # by the name recorded


def ask_of(
    each: TaskOperation,
    principal: Principal,
    task_id: str,
    namespace: str,
    data: Input,
    value: Any,
    *,
    result: Any = None,
) -> Ask:
    """A claim.v1 request (the typed input of its endpoint) as legacy is asked it. A commit completes with the
    result claim.v1 made canonical (``value``), else with ``result``."""
    if each.commits and value is not None:
        result = value.result
    return Ask(
        principal=principal,
        task_id=task_id,
        namespace=namespace,
        owner_id=data.named_owner() or principal.owner_id,
        api=CLAIM_V1,
        ttl_seconds=data.lease_seconds(),
        result=result,
        result_digest=data.digest_of_result(),
    )


# --- how an answer where legacy decided is built ---------------------------------------------------------------


def view(task_id: str, v1: V1Verdict, mismatch_id: int | None, task: Any = None) -> dict[str, Any]:
    """claim.v1's view of the task after judging in shadow (claim fields null where it refused)."""
    task = task or getattr(v1.value, "task", v1.value)
    if not isinstance(task, Task):
        task = Task.objects.get(pk=task_id)
    granted = v1.accepted and v1.word == "CLAIMED"
    return {
        "task_id": task.task_id,
        "input": task.input,
        "input_digest": task.input_digest,
        "state_version": task.state_version,
        "attempt_id": v1.value.attempt_id if granted else None,
        "scheduler_epoch": task.scheduler_epoch if granted else None,
        "claim_generation": task.claim_generation if granted else None,
        "cancel_generation": task.cancel_generation,
        "lease_expires_at": task.lease_expires_at if granted else None,
        "fences": getattr(v1.value, "fences", {}) if granted else {},
        "decided_by": "legacy",
        "shadow": {"verdict": v1.word, "reason": v1.reason or v1.word, "mismatch_id": mismatch_id},
    }
