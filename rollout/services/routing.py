"""Routing: for a claim.v1 worker operation and the namespace's stage, who decides and what is mirrored.

One service, called by the routed worker views (the only routes for their paths) with the operation's
validated input. It answers with a domain outcome (``Routed``) or raises a typed error:

| stage            | decides   | mirrored                                                                   |
|------------------|-----------|----------------------------------------------------------------------------|
| LEGACY           | nobody    | 409 STAGE_NOT_OPEN: the claim.v1 API is not open yet                       |
| SHADOW, V1_READS | legacy    | claim.v1 judges in shadow; verdicts compared (``shadow.compare``)          |
| V1_WRITES        | claim.v1  | its decision written through to the legacy store, for rollback            |
| V1_ONLY          | claim.v1  | nothing                                                                    |

First, the fast path: the core serves the request with a guard (``core.guarded``) that reads, under the
namespace lock the core's own transaction takes, whether claim.v1 alone decides (V1_ONLY, the worker's protocol
not refused — ``state.decides_alone``). When it does, that is the whole request: one transaction, one extra
statement. When it does not, the guard rolls the core's transaction back before anything was decided or written,
and the request takes the full routing below.

In every stage, first: the owner and the attempt named must be the caller's (403), a worker whose protocol was
refused is refused (PROTOCOL_TOO_OLD), and the epoch rule holds before legacy is asked — an old carried epoch, an
attempt granted before a fence, or a claim while claims are paused goes to the core, which refuses it and counts
the rejection. An attempt that does not exist, or a commit with nothing staged, goes to the core too: legacy,
whose complete is unconditional, is never asked on its behalf.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef

from claims import clock, interleave
from claims import services as core
from claims.errors import ClaimError, Forbidden, Invalid, InvalidTransition, NotFound
from claims.models import Attempt, Namespace, Principal, StagedResult, Task

from ..legacy import LegacyStore, LegacyVerdict, legacy_store
from ..models import Stage
from ..selectors import rollout_state as state_of
from .errors import LegacyRefused, StageNotOpen
from .shadow import V1Verdict, compare, judged, record_legacy
from .state import decides_alone, hold_for_decision
from .workers import protocol_too_old, refused_registrations

LEGACY_DECIDES = (Stage.SHADOW, Stage.V1_READS)
V1_DECIDES = (Stage.V1_WRITES, Stage.V1_ONLY)
CLAIM_V1 = "claim.v1"
SUCCESS = {"claim": "CLAIMED", "renew": "RENEWED", "release": "RELEASED", "commit": "COMMITTED"}


@dataclass(frozen=True)
class Target:
    namespace: Namespace
    stage: str
    min_protocol: str
    protocol_refused: bool = False


@dataclass(frozen=True)
class Routed:
    """Who decided, and the answer. ``value`` is the core's own (ClaimGrant, Task, Committed; None: claim-next
    found nothing) where claim.v1 decided; where legacy decided, ``fields`` is the answer: claim.v1's view of
    the task, ``decided_by: "legacy"`` and ``shadow: {verdict, reason, mismatch_id}``."""

    decided_by: str
    value: Any = None
    fields: dict[str, Any] | None = None


class _NotAlone(Exception):
    """Raised by the fast path's guard: claim.v1 does not decide alone here (not a Conflict, so not logged)."""


def _claim_v1_alone(principal: Principal) -> core.Guard:
    def check(point: str, ns: core.NamespaceHold) -> None:
        if not decides_alone(ns, principal):
            raise _NotAlone

    return check


# Which path to try first — a hint only, never a decision: both paths are right in every stage, the fast one just
# rolls back when the guard finds claim.v1 not alone. Where a namespace was lately seen not V1_ONLY (per name for
# claim-next, per process for the task operations, whose namespace is known only once locked), the full routing
# goes first, so the stages where legacy decides do not pay for a rolled-back try on every request.
_HINT_SECONDS = 30.0
_not_alone_at: dict[str, float] = {}


def forget_hints() -> None:
    _not_alone_at.clear()


def _fast(call: Any, principal: Principal, hint: str) -> Routed | None:
    """The request served by the core alone when, under its lock, claim.v1 decides alone; else None."""
    seen = _not_alone_at.get(hint)
    if seen is not None and time.monotonic() - seen < _HINT_SECONDS:
        return None
    try:
        with core.guarded(_claim_v1_alone(principal)):
            return Routed(CLAIM_V1, call())
    except _NotAlone:
        _not_alone_at[hint] = time.monotonic()
        return None


def _refused_in(principal: Principal, namespace_name: str) -> Exists:
    """Whether ``principal`` registered with a protocol the namespace (named by the outer query's
    ``namespace_name``) refused — read in the same query as the namespace."""
    return Exists(refused_registrations(principal).filter(namespace=OuterRef(namespace_name)))


def namespace_of(task_id: str, principal: Principal) -> Target:
    """The task's namespace with its rollout record, and whether this worker's protocol was refused there — one
    query. A first read, to choose who decides: where legacy decides, the choice is made again under the
    namespace's lock (``still_routed``)."""
    task = (
        Task.objects.select_related("namespace__rollout")
        .annotate(protocol_refused=_refused_in(principal, "namespace__name"))
        .filter(pk=task_id)
        .first()
    )
    if task is None:
        raise NotFound("no such task")
    return Target(task.namespace, *state_of(task.namespace), protocol_refused=task.protocol_refused)


def _epoch_rule_first(ns: Namespace, *, scheduler_epoch: int, claim: bool, granted_epoch: int | None) -> bool:
    if scheduler_epoch != ns.scheduler_epoch:
        return True
    if claim:
        return ns.claims_paused
    return granted_epoch is not None and granted_epoch != ns.scheduler_epoch


def still_routed(ns: Namespace, stage: str) -> bool:
    """Inside legacy's decision: the stage, epoch and pause the routing chose on are still the namespace's, read
    under its row lock (``state.hold_for_decision``) — else an advance, a rollback or a fence landed in between
    and the request goes through the routing again."""
    held = hold_for_decision(ns.id)
    return (held.stage, held.scheduler_epoch, held.claims_paused) == (
        stage,
        ns.scheduler_epoch,
        ns.claims_paused,
    )


def _core(operation: str, *, principal: Principal, task_id: str, data: dict[str, Any]) -> Any:
    """The core's own service for the operation."""
    if operation == "claim":
        return core.task_claim(principal=principal, task_id=task_id, **data)
    if operation == "renew":
        return core.task_renew(principal=principal, task_id=task_id, **data)
    if operation == "release":
        return core.task_release(principal=principal, task_id=task_id, **data)
    return core.task_commit(principal=principal, task_id=task_id, **data)


def _legacy(
    operation: str,
    store: LegacyStore,
    *,
    principal: Principal,
    task_id: str,
    namespace: str,
    data: dict[str, Any],
    staged: StagedResult | None,
    now: Any,
) -> LegacyVerdict:
    """The same operation as legacy decides it. A claim.v1 commit is a legacy `complete` by the attempt's owner
    with that attempt's staged result."""
    if operation == "claim":
        return store.claim(
            task_id=task_id,
            namespace=namespace,
            owner_id=data["owner_id"],
            ttl_seconds=data["ttl_seconds"],
            now=now,
            pool=principal.pool,
            via=CLAIM_V1,
        )
    if operation == "renew":
        return store.heartbeat(
            task_id=task_id, owner_id=data["owner_id"], ttl_seconds=data["extend_seconds"], now=now
        )
    if operation == "release":
        return store.release(task_id=task_id, owner_id=data["owner_id"], now=now)
    return store.complete(
        task_id=task_id,
        namespace=namespace,
        owner_id=principal.owner_id,
        result=staged.result if staged else None,
        result_digest=data["result_digest"],
        now=now,
        via=CLAIM_V1,
    )


def _write_through(
    operation: str,
    store: LegacyStore,
    value: Any,
    *,
    principal: Principal,
    task_id: str,
    namespace: str,
    data: dict[str, Any],
    staged: StagedResult | None,
    now: Any,
) -> None:
    """V1_WRITES: claim.v1's decision, recorded in the legacy store so a rollback finds it there."""
    if operation == "commit":
        _legacy(
            operation,
            store,
            principal=principal,
            task_id=task_id,
            namespace=namespace,
            data=data,
            staged=staged,
            now=now,
        )
        return
    task = value.task if operation == "claim" else value
    store.record_claim(
        task_id=task_id,
        namespace=namespace,
        owner_id=task.owner_id or "",
        expires_at=task.lease_expires_at,
        now=now,
        pool=principal.pool if operation != "release" else "",
    )


def _may_write_through(operation: str, ns: Namespace) -> bool:
    """Under the namespace's lock: a claim or renew claim.v1 granted is written through only while the epoch it was
    granted under is current — a fence (a rollback's first step) that landed after the grant ended that attempt,
    and the legacy store, which decides again after the rollback, must not learn of it. A commit and a release
    happened in claim.v1 before any fence, and are written through."""
    if operation not in ("claim", "renew"):
        return True
    return hold_for_decision(ns.id).scheduler_epoch == ns.scheduler_epoch


def _shadow(task_id: str, v1: V1Verdict, mismatch: Any) -> dict[str, Any]:
    """claim.v1's view of the task after judging in shadow (claim fields null where it refused)."""
    task = Task.objects.get(pk=task_id)
    granted = v1.accepted and v1.word == "CLAIMED"
    return {
        "task_id": task.task_id,
        "input": task.input,
        "input_digest": task.input_digest,
        "state_version": task.state_version,
        "attempt_id": v1.attempt_id if granted else None,
        "scheduler_epoch": task.scheduler_epoch if granted else None,
        "claim_generation": task.claim_generation if granted else None,
        "cancel_generation": task.cancel_generation,
        "lease_expires_at": task.lease_expires_at if granted else None,
        "fences": getattr(v1.value, "fences", {}) if granted else {},
        "decided_by": "legacy",
        "shadow": {
            "verdict": v1.word,
            "reason": v1.reason or v1.word,
            "mismatch_id": mismatch.id if mismatch else None,
        },
    }


def _refused(verdict: LegacyVerdict, fields: dict[str, Any]) -> LegacyRefused:
    return LegacyRefused(
        verdict.word,
        f"legacy refused: {verdict.word}",
        current={"owner_id": verdict.owner_id, "expires_at": verdict.expires_at},
        extra=fields,
    )


def route(operation: str, *, principal: Principal, task_id: str, data: dict[str, Any]) -> Routed:
    """Serve one claim.v1 worker operation (claim, renew, release, commit) as the namespace's stage says."""
    fast = _fast(lambda: _core(operation, principal=principal, task_id=task_id, data=data), principal, "")
    return fast if fast is not None else _route(operation, principal=principal, task_id=task_id, data=data)


def route_commits(*, principal: Principal, items: list[tuple[str, dict[str, Any]]]) -> dict[int, Any]:
    """claim-v1.md §9's commits decided together by the core (``task_commit_many``) when, under the locks it
    takes, claim.v1 decides alone for every namespace named; otherwise nothing is decided here and the caller
    routes each item as a single commit."""
    fast = _fast(lambda: core.task_commit_many(principal=principal, items=items), principal, "")
    return fast.value if fast is not None else {}


def _route(
    operation: str, *, principal: Principal, task_id: str, data: dict[str, Any], reroutes: int = 3
) -> Routed:
    target = namespace_of(task_id, principal)  # 404 before the owner's 403 (claim-v1.md §2)
    ns, stage = target.namespace, target.stage
    owner_id = data.get("owner_id", principal.owner_id)
    if owner_id != principal.owner_id:
        raise Forbidden(f"this token acts as {principal.owner_id!r}, not {owner_id!r}")
    attempt_id = data.get("attempt_id")
    core_decides, granted_epoch = False, None
    if attempt_id is not None:
        row = (
            Attempt.objects.filter(pk=attempt_id, task_id=task_id)
            .values_list("owner_id", "scheduler_epoch")
            .first()
        )
        if row is not None and row[0] != principal.owner_id:
            raise Forbidden(f"attempt {attempt_id} is not {principal.owner_id!r}'s")
        core_decides, granted_epoch = row is None, row[1] if row else None
    if target.protocol_refused:
        raise protocol_too_old(stage)
    core_decides = (
        core_decides
        or stage == Stage.V1_ONLY
        or _epoch_rule_first(
            ns, scheduler_epoch=data["scheduler_epoch"], claim=attempt_id is None, granted_epoch=granted_epoch
        )
    )
    if not core_decides and stage == Stage.LEGACY:
        raise StageNotOpen(
            f"namespace {ns.name} is at LEGACY: the claim.v1 API is not open yet", current={"stage": stage}
        )
    staged = None
    if operation == "commit" and not core_decides:
        staged = StagedResult.objects.filter(
            task_id=task_id, attempt_id=data["attempt_id"], result_digest=data["result_digest"]
        ).first()
        if staged is None and "result" in data:
            # claim-v1.md §9: the result inline is what legacy completes with; claim.v1 stages it in its commit.
            staged = StagedResult(task_id=task_id, result=data["result"], result_digest=data["result_digest"])
        # Legacy would decide on nothing: the core answers, and it can only refuse.
        core_decides = staged is None and stage in LEGACY_DECIDES
    if core_decides:
        return Routed(CLAIM_V1, _core(operation, principal=principal, task_id=task_id, data=data))
    context: dict[str, Any] = {
        "principal": principal,
        "task_id": task_id,
        "namespace": ns.name,
        "data": data,
        "staged": staged,
    }
    interleave.reach("routing.routed")
    store = legacy_store()
    if stage == Stage.V1_WRITES:
        value = _core(operation, principal=principal, task_id=task_id, data=data)
        interleave.reach("routing.decided")
        with transaction.atomic(durable=True):
            if _may_write_through(operation, ns):
                _write_through(operation, store, value, now=clock.now(), **context)
        return Routed(CLAIM_V1, value)
    with transaction.atomic(durable=True):
        still = still_routed(ns, stage)
        if still:
            now = clock.now()
            verdict = _legacy(operation, store, now=now, **context)
            record_legacy(ns.name, task_id, operation, CLAIM_V1, owner_id, verdict, now)
    if not still:
        if reroutes == 0:
            raise InvalidTransition(
                "the namespace's stage kept moving under this request: send it again", reason="STAGE_CHANGED"
            )
        return _route(operation, principal=principal, task_id=task_id, data=data, reroutes=reroutes - 1)
    v1 = judged(
        lambda: _core(operation, principal=principal, task_id=task_id, data=data),
        accepted_word=SUCCESS[operation],
    )
    mismatch = compare(
        namespace=ns.name,
        task_id=task_id,
        operation=operation,
        api=CLAIM_V1,
        owner_id=owner_id,
        legacy=verdict,
        v1=v1,
    )
    fields = _shadow(task_id, v1, mismatch)
    if not verdict.accepted:
        raise _refused(verdict, fields)
    if operation == "commit" and v1.accepted:
        fields.update(result_commit_id=v1.value.result_commit_id, unblocked=v1.value.unblocked)
        if v1.value.staged_result_id is not None:
            fields["staged_result_id"] = v1.value.staged_result_id
    if operation == "renew":
        fields["lease_expires_at"] = verdict.expires_at
    return Routed("legacy", v1.value, {"outcome": SUCCESS[operation], **fields})


def route_claim_next(*, principal: Principal, data: dict[str, Any]) -> Routed:
    """Claim-next by stage: claim.v1 picks (its SKIP LOCKED frontier) in every open stage; where legacy decides
    it then decides the grant, and in V1_WRITES claim.v1's grant is written through."""
    fast = _fast(
        lambda: core.task_claim_next(principal=principal, **data), principal, data.get("namespace", "default")
    )
    if fast is not None:
        return fast
    name = data.get("namespace", "default")
    ns = (
        Namespace.objects.select_related("rollout")
        .annotate(protocol_refused=_refused_in(principal, "name"))
        .filter(name=name)
        .first()
    )
    if ns is None:
        raise Invalid({"namespace": [f"unknown namespace {name!r}"]})
    stage, _ = state_of(ns)
    if ns.protocol_refused:
        raise protocol_too_old(stage)
    if stage == Stage.LEGACY:
        raise StageNotOpen(
            f"namespace {ns.name} is at LEGACY: the claim.v1 API is not open yet", current={"stage": stage}
        )
    grant = core.task_claim_next(principal=principal, **data)
    if (
        grant is None
        or stage == Stage.V1_ONLY
        or data["scheduler_epoch"] != ns.scheduler_epoch
        or ns.claims_paused
    ):
        return Routed(CLAIM_V1, grant)
    task = grant.task
    store = legacy_store()
    interleave.reach("routing.decided")
    with transaction.atomic(durable=True):
        # Who decides the grant, chosen again under the namespace's lock: claim.v1's grant stands alone if a fence
        # ended it meanwhile (or the stage reached V1_ONLY), and is written through if the stage reached V1_WRITES.
        held = hold_for_decision(ns.id)
        if (held.scheduler_epoch, held.claims_paused) != (ns.scheduler_epoch, ns.claims_paused):
            return Routed(CLAIM_V1, grant)
        stage = held.stage
        now = clock.now()
        if stage == Stage.V1_ONLY:
            return Routed(CLAIM_V1, grant)
        if stage == Stage.V1_WRITES:
            store.record_claim(
                task_id=task.task_id,
                namespace=ns.name,
                owner_id=task.owner_id or "",
                expires_at=task.lease_expires_at,
                now=now,
                pool=principal.pool,
            )
            return Routed(CLAIM_V1, grant)
        verdict = store.claim(
            task_id=task.task_id,
            namespace=ns.name,
            owner_id=principal.owner_id,
            ttl_seconds=data["ttl_seconds"],
            now=now,
            pool=principal.pool,
            via=CLAIM_V1,
        )
        record_legacy(ns.name, task.task_id, "claim", CLAIM_V1, principal.owner_id, verdict, now)
    v1 = V1Verdict(True, "CLAIMED", attempt_id=str(grant.attempt_id), claim_generation=task.claim_generation)
    mismatch = compare(
        namespace=ns.name,
        task_id=task.task_id,
        operation="claim",
        api=CLAIM_V1,
        owner_id=principal.owner_id,
        legacy=verdict,
        v1=v1,
    )
    fields = {
        **grant.fields(),
        "decided_by": "legacy",
        "shadow": {
            "verdict": "CLAIMED",
            "reason": "CLAIMED",
            "mismatch_id": mismatch.id if mismatch else None,
        },
    }
    if not verdict.accepted:
        fields.pop("outcome")
        raise _refused(verdict, fields)
    return Routed("legacy", grant, fields)


def route_claim_batch(*, principal: Principal, data: dict[str, Any]) -> list[Routed]:
    """A batch claim by stage (claim-v1.md §9). Where claim.v1 decides alone: one transaction of the core's
    (``task_claim_batch``). Elsewhere: claim-next as the stage routes it, up to ``max_tasks`` times, each its own
    decision. A task legacy refuses is left out of the answer — and so its claim.v1 grant, which the worker is never
    told of, is released at once (not left to run out its lease) and the next picks pass it over; the refusal is
    raised only if nothing was granted."""
    fast = _fast(
        lambda: core.task_claim_batch(principal=principal, **data),
        principal,
        data.get("namespace", "default"),
    )
    if fast is not None:
        return [Routed(CLAIM_V1, grant) for grant in fast.value]
    passed_over: list[str] = []
    one = {key: value for key, value in data.items() if key != "max_tasks"}
    granted: list[Routed] = []
    refused: LegacyRefused | None = None
    for _ in range(data["max_tasks"]):
        try:
            routed = route_claim_next(principal=principal, data={**one, "passed_over": passed_over})
        except LegacyRefused as exc:
            refused = exc
            _release_unannounced(principal, data["owner_id"], exc.extra)
            passed_over.append(exc.extra["task_id"])
            continue
        if routed.value is None:
            break
        granted.append(routed)
    if not granted and refused is not None:
        raise refused
    return granted


def _release_unannounced(principal: Principal, owner_id: str, grant: dict[str, Any]) -> None:
    """The claim.v1 grant behind a claim legacy refused inside a batch: nobody will be told of it, so it ends now."""
    try:
        core.task_release(
            principal=principal,
            task_id=grant["task_id"],
            attempt_id=grant["attempt_id"],
            claim_generation=grant["claim_generation"],
            owner_id=owner_id,
            scheduler_epoch=grant["scheduler_epoch"],
        )
    except ClaimError:  # a fence or a reclaim ended it first: nothing of ours is left
        pass
