"""The routed operations as a table. Each is a small typed description: what the legacy store is asked, how
claim.v1's decision is written through to it (V1_WRITES), and what claim.v1's accepted answer says — so that the
routing (``routing.py``) and the legacy API (``legacy_api.py``) hold no operation's name and decide every
operation in the same few places.

``TaskOperation`` is one task's operation as both stores see it; ``Route`` is one claim.v1 worker endpoint: the
core service that decides it and the tasks its answer decided (a batch decides several).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from claims import services as core
from claims.errors import ClaimError
from claims.models import Principal, Task

from ..legacy import LegacyAsk, LegacyStore, LegacyVerdict, decide

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
class TaskOperation:
    """One task's operation: ``name`` as legacy's history and the comparisons record it, ``accepted`` claim.v1's
    word when it accepts; ``asked`` what the legacy store is asked, ``written`` how claim.v1's decision (its
    value) is written through to it in V1_WRITES — each a ``LegacyAsk`` the store decides with others at once
    (``legacy.decide``). ``claims``: its gate is the carried epoch and the pause. ``commits``: legacy is asked
    only with a result to complete with (staged, or inline)."""

    name: str
    accepted: str
    asked: Callable[[Ask], LegacyAsk]
    written: Callable[[Ask, Any], LegacyAsk]
    claims: bool = False
    commits: bool = False

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


CLAIM = TaskOperation("claim", "CLAIMED", _claim, _held_by, claims=True)
RENEW = TaskOperation("renew", "RENEWED", _heartbeat, _held_by)
RELEASE = TaskOperation("release", "RELEASED", _release, _let_go)
COMMIT = TaskOperation("commit", "COMMITTED", _complete, _completed, commits=True)

# The legacy protocol's own operations: the same decisions, under the names legacy's binaries use.
LEGACY_OPERATIONS = {
    "claim": CLAIM,
    "heartbeat": replace(RENEW, name="heartbeat"),
    "release": RELEASE,
    "complete": replace(COMMIT, name="complete"),
}


@dataclass(frozen=True)
class Route:
    """One claim.v1 worker endpoint: ``each`` is what it is to every task it decides, ``core`` the core service
    that decides it (called with the principal, the task named — None for claim-next and batches — and the
    validated input), ``decided`` the tasks in the core's answer with each one's value."""

    name: str
    each: TaskOperation
    core: Callable[[Principal, Any, dict[str, Any]], Any]
    decided: Callable[[str | None, dict[str, Any], Any], list[Decided]]


Decided = tuple[str, dict[str, Any], Any]  # a task, its request's input, and the core's answer on it


def _named(task_id: str | None, data: dict[str, Any], value: Any) -> list[Decided]:
    assert task_id is not None
    return [(task_id, data, value)]


def _grants(task_id: str | None, data: dict[str, Any], grants: Any) -> list[Decided]:
    return [(grant.task.task_id, data, grant) for grant in grants]


def _items(task_id: str | None, data: dict[str, Any], answers: Any) -> list[Decided]:
    """A batch commit's items on the namespace settled: accepted ones with the core's answer, refused ones with
    the refusal (legacy may still decide those)."""
    items = data["items"]
    return [(items[index][0], items[index][1], answer) for index, answer in sorted(answers.items())]


ROUTES = {
    "claim": Route("claim", CLAIM, lambda p, t, d: core.task_claim(principal=p, task_id=t, **d), _named),
    "renew": Route("renew", RENEW, lambda p, t, d: core.task_renew(principal=p, task_id=t, **d), _named),
    "release": Route(
        "release", RELEASE, lambda p, t, d: core.task_release(principal=p, task_id=t, **d), _named
    ),
    "commit": Route("commit", COMMIT, lambda p, t, d: core.task_commit(principal=p, task_id=t, **d), _named),
    "claim_next": Route("claim_next", CLAIM, lambda p, t, d: core.task_claim_next(principal=p, **d), _grants),
    "claim_batch": Route(
        "claim_batch", CLAIM, lambda p, t, d: core.task_claim_batch(principal=p, **d), _grants
    ),
    "commits": Route(
        "commits", COMMIT, lambda p, t, d: core.task_commit_many(principal=p, items=d["items"]), _items
    ),
}


def ask_of(
    each: TaskOperation,
    principal: Principal,
    task_id: str,
    namespace: str,
    data: dict[str, Any],
    value: Any,
    *,
    result: Any = None,
) -> Ask:
    """A claim.v1 request (the validated input of its endpoint) as legacy is asked it. A commit completes with
    the result claim.v1 made canonical (``value``), else with ``result``."""
    if each.commits and value is not None:
        result = value.result
    return Ask(
        principal=principal,
        task_id=task_id,
        namespace=namespace,
        owner_id=data.get("owner_id", principal.owner_id),
        api=CLAIM_V1,
        ttl_seconds=data.get("ttl_seconds", data.get("extend_seconds", 30)),
        result=result,
        result_digest=data.get("result_digest", ""),
    )


# --- how an answer where legacy decided is built ---------------------------------------------------------------


def extras(each: TaskOperation, v1: V1Verdict, verdict: LegacyVerdict) -> dict[str, Any]:
    """What the accepted answer adds to the task view: a commit's ids where claim.v1 committed too, a renew's
    expiry as legacy set it."""
    if each.commits and v1.accepted:
        extra = {"result_commit_id": v1.value.result_commit_id, "unblocked": v1.value.unblocked}
        if v1.value.staged_result_id is not None:
            extra["staged_result_id"] = v1.value.staged_result_id
        return extra
    if each.name == "renew":
        return {"lease_expires_at": verdict.expires_at}
    return {}


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
