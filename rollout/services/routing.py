"""Routing: for a claim.v1 worker operation and the namespace's stage, who decides and what is mirrored.

| stage            | decides   | mirrored                                                                   |
|------------------|-----------|----------------------------------------------------------------------------|
| LEGACY           | nobody    | 409 STAGE_NOT_OPEN: the claim.v1 API is not open yet                       |
| SHADOW, V1_READS | legacy    | claim.v1 judges in shadow; verdicts compared (``shadow.compare``)          |
| V1_WRITES        | claim.v1  | its decision written through to the legacy store, for rollback            |
| V1_ONLY          | claim.v1  | nothing                                                                    |

Every operation — claim, renew, release, commit, claim-next, a batch claim, a batch commit — takes one path, the
operation table's (``operations.ROUTES``): the core's own service runs with the stage hook (``_StageHook``, a
``core.Guard``). Inside the core's transaction, once the namespace is held FOR SHARE, the hook reads the stage
and the worker's registration (one statement; every stage change waits for that lock, so the stage holds until
the decision commits). The core decides; before its transaction commits the hook settles the decision as the
stage says — nothing in V1_ONLY, a write-through in V1_WRITES, and where legacy decides, legacy's decision on
each task, its history and the comparison — all in the decision's transaction, under its locks, in the lock
order docs/architecture.md gives (the legacy row last).

Two cases leave that path:

- claim.v1 refuses in a stage where legacy decides (``_after_refusal``). Its transaction rolled back, so legacy
  decides in a transaction of its own (``legacy_decides``), with the refusal as claim.v1's verdict — unless the
  request is claim.v1's alone: an old carried epoch, an attempt granted before a fence or unknown, a claim while
  claims are paused, or a commit with no result to complete with. Legacy, whose complete is unconditional, is
  never asked on such a request's behalf.
- the namespace is at LEGACY (``_at_legacy``): only a request that is claim.v1's alone is answered (by its
  refusal); any other is 409 STAGE_NOT_OPEN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.db import transaction
from django.db.models import Exists, OuterRef

from claims import clock, interleave
from claims import services as core
from claims.errors import ClaimError, Conflict, Forbidden, InvalidTransition, NotFound
from claims.models import Attempt, Namespace, Principal, StagedResult, Task

from ..legacy import LegacyVerdict, decide, legacy_store, legacy_unit
from ..models import Stage
from ..selectors import rollout_state as state_of
from . import adoption, write_through
from .errors import LegacyRefused, StageNotOpen
from .operations import (
    CLAIM_V1,
    LEGACY,
    ROUTES,
    Ask,
    Route,
    TaskOperation,
    V1Verdict,
    ask_of,
    extras,
    refused,
    view,
)
from .shadow import Records, compare, record_legacy
from .state import hold_for_decision, stage_for
from .workers import protocol_too_old, refused_registrations

LEGACY_DECIDES = (Stage.SHADOW, Stage.V1_READS)
V1_DECIDES = (Stage.V1_WRITES, Stage.V1_ONLY)
T = TypeVar("T")
__all__ = ["CLAIM_V1", "LEGACY", "LEGACY_DECIDES", "V1_DECIDES", "Routed", "route", "legacy_decides"]


@dataclass(frozen=True)
class Routed:
    """Who decided, and the answer. ``value`` is the core's own (ClaimGrant, Task, Committed; None: claim-next
    found nothing) where claim.v1 decided; where legacy decided, ``fields`` is the answer: claim.v1's view of
    the task, ``decided_by: "legacy"`` and ``shadow: {verdict, reason, mismatch_id}``."""

    decided_by: str
    value: Any = None
    fields: dict[str, Any] | None = None
    legacy: LegacyVerdict | None = None  # legacy's verdict, where it decided

    @property
    def refused(self) -> bool:
        return self.legacy is not None and not self.legacy.accepted


@dataclass(frozen=True)
class Target:
    """A first read of where a task's request goes (outside any lock: chosen again under it)."""

    namespace: Namespace
    stage: str
    protocol_refused: bool = False


class _Unwind(Exception):
    """Raised by the stage hook to roll the core's transaction back without a rejection being logged (it is not
    a ``Conflict``). ``error``: the answer (403, PROTOCOL_TOO_OLD); None: the request leaves the one path — the
    namespace is at LEGACY, or a batch claim met a legacy refusal."""

    def __init__(self, error: ClaimError | None = None):
        super().__init__(error)
        self.error = error


@dataclass
class _StageHook(core.Guard):
    """The stage's part of one routed decision, run by the core inside its transaction."""

    route: Route
    principal: Principal
    task_id: str | None
    data: dict[str, Any]
    unwind_on_legacy_refusal: bool = False
    stages: dict[int, str] = field(default_factory=dict)
    legacy: dict[str, Routed] = field(default_factory=dict)  # by task: what legacy decided

    def check(self, point: str, ns: core.NamespaceHold) -> None:
        owner_id = self.data.get("owner_id")
        if owner_id is not None and owner_id != self.principal.owner_id:
            raise _Unwind(Forbidden(f"this token acts as {self.principal.owner_id!r}, not {owner_id!r}"))
        stage, protocol_refused = stage_for(ns, self.principal)
        if protocol_refused:
            raise _Unwind(protocol_too_old(stage))
        if stage == Stage.LEGACY:
            if self.task_id is None:  # claim-next and batches pick no task where claim.v1 is not open
                raise _Unwind(_not_open(ns.name))
            raise _Unwind()
        self.stages[ns.id] = stage

    def settle(self, point: str, ns: core.NamespaceHold, value: Any) -> None:
        stage = self.stages[ns.id]
        if stage == Stage.V1_ONLY:
            return
        interleave.reach("routing.settling")
        each, records = self.route.each, Records()
        decided_here = self.route.decided(self.task_id, self.data, value)
        accepted = [
            (ask_of(each, self.principal, task_id, ns.name, data, decided), decided)
            for task_id, data, decided in decided_here
            if not isinstance(decided, ClaimError)
        ]
        if stage == Stage.V1_WRITES:
            written, store = [each.written(ask, decided) for ask, decided in accepted], legacy_store()
            if store.separate_database:  # in the team's own database: recorded here, applied after our commit
                write_through.record(written, namespace=ns.name, at=ns.now)
            else:  # the emulated table: in this transaction
                decide(store, written)
            return
        views = _views_after_commits(each, stage, decided_here)
        verdicts = _legacy_decisions(each, [ask for ask, _ in accepted], records)
        for (ask, decided), verdict in zip(accepted, verdicts, strict=True):
            if not verdict.accepted and self.unwind_on_legacy_refusal:
                raise _Unwind()
            self.legacy[ask.task_id] = _compared(
                each,
                ask,
                verdict,
                each.verdict(decided),
                records,
                same_result=True,
                task=views.get(ask.task_id),
            )
        for task_id, data, decided in decided_here:  # a batch commit's refused items
            if isinstance(decided, Conflict):
                self._refused_item(each, ns, task_id, data, decided, records)
        records.send()

    def _refused_item(
        self,
        each: TaskOperation,
        ns: core.NamespaceHold,
        task_id: str,
        data: dict[str, Any],
        exc: ClaimError,
        records: Records,
    ) -> None:
        result = _result_to_complete(each, task_id, data)
        if _claim_v1_alone(each, task_id, data, ns.scheduler_epoch, ns.claims_paused, result):
            return
        ask = ask_of(each, self.principal, task_id, ns.name, data, None, result=result[1])
        self.legacy[task_id] = _compared(
            each, ask, legacy_decision(each, ask, records), refused(exc), records
        )


def route(name: str, *, principal: Principal, task_id: str | None = None, data: dict[str, Any]) -> Any:
    """Serve one claim.v1 worker operation (``operations.ROUTES``) as the namespace's stage says: its Routed
    answer (a list for a batch claim; by item index for a batch commit)."""
    return _route(ROUTES[name], principal, task_id, data)


def _route(
    route: Route, principal: Principal, task_id: str | None, data: dict[str, Any], reroutes: int = 3
) -> Any:
    interleave.reach("routing.routed")
    hook = _StageHook(route, principal, task_id, data, unwind_on_legacy_refusal=route.name == "claim_batch")
    try:
        with legacy_unit(), core.guarded(hook):  # a legacy table elsewhere commits after ours, or rolls back
            value = route.core(principal, task_id, data)
    except _Unwind as unwound:
        if route.name == "commits":  # each item is routed as its single commit is
            return {}
        if unwound.error is not None:
            raise unwound.error from None
        if task_id is None:  # a batch claim met a legacy refusal
            return _claims_one_by_one(principal, data)
        return _at_legacy(route, principal, task_id, data)
    except Conflict as exc:  # a protocol refusal; a 400, 403 or 404 is the answer in every stage
        if task_id is None or not _legacy_stage_of(hook):
            raise
        return _after_refusal(route, principal, task_id, data, exc, reroutes)
    return _answer(route, hook, task_id, data, value)


def _answer(route: Route, hook: _StageHook, task_id: str | None, data: dict[str, Any], value: Any) -> Any:
    """The core's value where claim.v1 decided; legacy's answer (or its refusal) where legacy did."""
    if route.name == "claim_batch":
        return [hook.legacy.get(grant.task.task_id) or Routed(CLAIM_V1, grant) for grant in value]
    if route.name == "commits":
        items = data["items"]
        return {
            index: _item_answer(hook.legacy.get(items[index][0]), answer) for index, answer in value.items()
        }
    if route.name == "claim_next":
        decided = hook.legacy.get(value.task.task_id) if value is not None else None
    else:
        decided = hook.legacy.get(task_id or "")
    if decided is None:
        return Routed(CLAIM_V1, value)
    if decided.refused:  # legacy's word, with claim.v1's view
        raise _legacy_refusal(decided)
    return decided


def _item_answer(decided: Routed | None, answer: Any) -> Any:
    if decided is None:
        return answer
    return _legacy_refusal(decided) if decided.refused else decided.fields


def _legacy_stage_of(hook: _StageHook) -> bool:
    return any(stage in LEGACY_DECIDES for stage in hook.stages.values())


def _views_after_commits(each: TaskOperation, stage: str, decided: list[Any]) -> dict[str, Task]:
    """Where legacy decides, the tasks claim.v1 committed, read once for every answer's view of them (a claim,
    renew or release answer carries its task already)."""
    if not each.commits or stage not in LEGACY_DECIDES:
        return {}
    return Task.objects.in_bulk(
        [task_id for task_id, _, value in decided if not isinstance(value, ClaimError)]
    )


def legacy_decision(each: TaskOperation, ask: Ask, records: Records) -> LegacyVerdict:
    """Legacy's decision on one task, recorded in its history, inside the caller's transaction."""
    return _legacy_decisions(each, [ask], records)[0]


def _legacy_decisions(each: TaskOperation, asks: list[Ask], records: Records) -> list[LegacyVerdict]:
    """Legacy's decisions on the tasks asked — at once where the store can (``legacy.decide``) — each recorded in
    its history, inside the caller's transaction (the legacy rows are the last locks it takes; the store reads its
    clock after them)."""
    verdicts = decide(legacy_store(), [each.asked(ask) for ask in asks]) if asks else []
    for ask, verdict in zip(asks, verdicts, strict=True):
        at = verdict.at or clock.now()
        record_legacy(ask.namespace, ask.task_id, each.name, ask.api, ask.owner_id, verdict, at, records)
    return verdicts


def _compared(
    each: TaskOperation,
    ask: Ask,
    verdict: LegacyVerdict,
    v1: V1Verdict,
    records: Records,
    *,
    same_result: bool = False,
    task: Task | None = None,
) -> Routed:
    """The comparison recorded, and the answer as legacy decided it: ``decided_by`` is ``legacy`` when it
    accepted, else its refusal word (raised by the caller once the transaction is over)."""
    mismatch = compare(
        namespace=ask.namespace,
        task_id=ask.task_id,
        operation=each.name,
        api=ask.api,
        owner_id=ask.owner_id,
        legacy=verdict,
        v1=v1,
        same_result=same_result,
        records=records,
    )
    fields = view(ask.task_id, v1, mismatch.id if mismatch else None, task)
    if verdict.accepted:
        fields = {"outcome": each.accepted, **fields, **extras(each, v1, verdict)}
    return Routed(LEGACY, v1.value, fields, legacy=verdict)


def _legacy_refusal(decided: Routed) -> LegacyRefused:
    verdict = decided.legacy
    assert verdict is not None
    return LegacyRefused(
        verdict.word,
        f"legacy refused: {verdict.word}",
        current={"owner_id": verdict.owner_id, "expires_at": verdict.expires_at},
        extra=decided.fields,
    )


def _not_open(name: str) -> StageNotOpen:
    return StageNotOpen(
        f"namespace {name} is at LEGACY: the claim.v1 API is not open yet", current={"stage": Stage.LEGACY}
    )


# --- leaving the one path -------------------------------------------------------------------------------------


def namespace_of(task_id: str, principal: Principal) -> Target:
    """The task's namespace with its stage, and whether this worker's protocol was refused there — one query.
    A first read: the choice it makes is made again under the namespace's lock (``still_routed``)."""
    task = (
        Task.objects.select_related("namespace__rollout")
        .annotate(
            protocol_refused=Exists(
                refused_registrations(principal).filter(namespace=OuterRef("namespace__name"))
            )
        )
        .filter(pk=task_id)
        .first()
    )
    if task is None:
        if not adoption.sighted(task_id):  # proxy mode: a row of their table named for the first time
            raise NotFound("no such task")
        return namespace_of(task_id, principal)
    stage, _ = state_of(task.namespace)
    return Target(task.namespace, stage, protocol_refused=task.protocol_refused)


def still_routed(ns: Namespace, stage: str) -> bool:
    """Inside legacy's own transaction: the stage, epoch and pause the request was routed on are still the
    namespace's, read under its row lock (``state.hold_for_decision``) — else an advance, a rollback or a fence
    landed in between and the request goes through the routing again."""
    held = hold_for_decision(ns.id)
    return (held.stage, held.scheduler_epoch, held.claims_paused) == (
        stage,
        ns.scheduler_epoch,
        ns.claims_paused,
    )


def legacy_decides(
    each: TaskOperation,
    ask: Ask,
    target: Target,
    then: Callable[[LegacyVerdict, Records], T],
) -> T | None:
    """Legacy's decision on ``ask`` in a transaction of its own — the one place legacy decides outside a claim.v1
    decision's transaction — when the namespace is still as ``target`` read it (else None: the caller routes
    again). ``then`` runs on the verdict in the same transaction (the comparison, where claim.v1 judged first)."""
    with legacy_unit(), transaction.atomic(durable=True):
        if not still_routed(target.namespace, target.stage):
            return None
        records = Records()
        answer = then(legacy_decision(each, ask, records), records)
        records.send()
        return answer


def _result_to_complete(each: TaskOperation, task_id: str, data: dict[str, Any]) -> tuple[bool, Any]:
    """A commit's result as legacy would complete with it — inline, or the attempt's staged one: (found, result)."""
    if not each.commits:
        return False, None
    if "result" in data:
        return True, data["result"]
    staged = list(
        StagedResult.objects.filter(
            task_id=task_id, attempt_id=data["attempt_id"], result_digest=data["result_digest"]
        ).values_list("result", flat=True)[:1]
    )
    return bool(staged), staged[0] if staged else None


def _claim_v1_alone(
    each: TaskOperation,
    task_id: str,
    data: dict[str, Any],
    epoch: int,
    paused: bool,
    result: tuple[bool, Any],
) -> bool:
    """Whether a request is claim.v1's to answer alone, in every stage: its carried epoch is old, it is a claim
    while claims are paused, the attempt it names is unknown or was granted before a fence, or it is a commit with
    nothing to complete with."""
    if data["scheduler_epoch"] != epoch:
        return True
    if each.claims:
        return paused
    granted = (
        Attempt.objects.filter(pk=data["attempt_id"], task_id=task_id)
        .values_list("scheduler_epoch", flat=True)
        .first()
    )
    if granted is None or granted != epoch:
        return True
    return each.commits and not result[0]


def _after_refusal(
    route: Route, principal: Principal, task_id: str, data: dict[str, Any], exc: Conflict, reroutes: int
) -> Routed:
    """claim.v1 refused where legacy decides: legacy decides in its own transaction, compared with the refusal,
    unless the request is claim.v1's alone (then the refusal is the answer)."""
    each = route.each
    target = namespace_of(task_id, principal)
    ns = target.namespace
    result = _result_to_complete(each, task_id, data)
    if target.stage not in LEGACY_DECIDES or _claim_v1_alone(
        each, task_id, data, ns.scheduler_epoch, ns.claims_paused, result
    ):
        raise exc
    interleave.reach("routing.refused")
    ask = ask_of(each, principal, task_id, ns.name, data, None, result=result[1])
    v1 = refused(exc)
    decided = legacy_decides(
        each, ask, target, lambda verdict, records: _compared(each, ask, verdict, v1, records)
    )
    if decided is None:  # the namespace moved since claim.v1 refused: the request is routed again
        if reroutes == 0:
            raise InvalidTransition(
                "the namespace's stage kept moving under this request: send it again", reason="STAGE_CHANGED"
            )
        return _route(route, principal, task_id, data, reroutes - 1)
    if decided.refused:
        raise _legacy_refusal(decided)
    return decided


def _at_legacy(route: Route, principal: Principal, task_id: str, data: dict[str, Any]) -> Routed:
    """The namespace is at LEGACY: claim.v1's API is not open — but a request claim.v1 alone answers (an old
    epoch, a fenced or unknown attempt, nothing to commit) is answered by claim.v1, as in every stage."""
    target = namespace_of(task_id, principal)
    ns, each = target.namespace, route.each
    result = _result_to_complete(each, task_id, data)
    if target.stage == Stage.LEGACY and not _claim_v1_alone(
        each, task_id, data, ns.scheduler_epoch, ns.claims_paused, result
    ):
        raise _not_open(ns.name)
    return Routed(CLAIM_V1, route.core(principal, task_id, data))


def _claims_one_by_one(principal: Principal, data: dict[str, Any]) -> list[Routed]:
    """A batch claim that met a legacy refusal (or a namespace at LEGACY): claim-next routed up to ``max_tasks``
    times, each its own decision. A task legacy refuses is left out of the answer — its claim.v1 grant, which the
    worker is never told of, is released at once and the next picks pass it over; the refusal is raised only if
    nothing was granted."""
    passed_over: list[str] = []
    one = {key: value for key, value in data.items() if key != "max_tasks"}
    granted: list[Routed] = []
    refusal: LegacyRefused | None = None
    for _ in range(data["max_tasks"]):
        try:
            routed = route("claim_next", principal=principal, data={**one, "passed_over": passed_over})
        except LegacyRefused as exc:
            refusal = exc
            _release_unannounced(principal, data["owner_id"], exc.extra)
            passed_over.append(exc.extra["task_id"])
            continue
        if routed.value is None:
            break
        granted.append(routed)
    if not granted and refusal is not None:
        raise refusal
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
