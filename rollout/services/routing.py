"""Routing: for a claim.v1 worker operation and the namespace's stage, who decides and what is mirrored.

| stage            | decides   | mirrored                                                                   |
|------------------|-----------|----------------------------------------------------------------------------|
| LEGACY           | nobody    | 409 STAGE_NOT_OPEN: the claim.v1 API is not open yet                       |
| SHADOW, V1_READS | legacy    | claim.v1 judges in shadow; verdicts compared (``shadow.compare``)          |
| V1_WRITES        | claim.v1  | its decision written through to the legacy store, for rollback            |
| V1_ONLY          | claim.v1  | nothing                                                                    |

Every operation — claim, renew, release, commit, claim-next, a batch claim, a batch commit — takes one path, the
operation table's (``routes.py``: one typed row per endpoint): the core's own service runs with the stage hook (``_StageHook``, a
``core.Guard``). Inside the core's transaction, once the namespace is held FOR SHARE, the hook reads the stage
and the worker's registration (one statement; every stage change waits for that lock, so the stage holds until
the decision commits). The core decides; before its transaction commits the hook settles the decision as the
stage says — nothing in V1_ONLY, a write-through in V1_WRITES, and where legacy decides, legacy's decision on
each task, its history and the comparison — all in the decision's transaction, under its locks, in the lock
order docs/architecture.md gives (the legacy row last).

Two cases leave that path:

- claim.v1 refuses in a stage where legacy decides (``_after_refusal``). Its transaction rolled back, so legacy
  decides in a transaction of its own (``deciding.legacy_decides``), with the refusal as claim.v1's verdict — unless the
  request is claim.v1's alone: an old carried epoch, an attempt granted before a fence or unknown, a claim while
  claims are paused, or a commit with no result to complete with. Legacy, whose complete is unconditional, is
  never asked on such a request's behalf.
- the namespace is at LEGACY (``_at_legacy``): only a request that is claim.v1's alone is answered (by its
  refusal); any other is 409 STAGE_NOT_OPEN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from claims import interleave
from claims import services as core
from claims.errors import ClaimError, Conflict, Forbidden, InvalidTransition
from claims.models import Principal, Task

from ..legacy import decide, legacy_store, legacy_unit
from ..models import Stage
from . import write_through
from .deciding import (
    Routed,
    claim_v1_alone,
    compared,
    legacy_decides,
    legacy_decision,
    legacy_decisions,
    legacy_refusal,
    namespace_of,
    result_to_complete,
)
from .errors import LegacyRefused, StageNotOpen
from .inputs import ClaimBatchInput, CommitsInput, Input
from .operations import CLAIM_V1, LEGACY, TaskOperation, ask_of, refused
from .routes import CLAIM_NEXT_ROUTE, Route, Shape
from .shadow import Records
from .state import stage_for
from .workers import protocol_too_old

LEGACY_DECIDES = (Stage.SHADOW, Stage.V1_READS)
V1_DECIDES = (Stage.V1_WRITES, Stage.V1_ONLY)
__all__ = ["CLAIM_V1", "LEGACY", "LEGACY_DECIDES", "V1_DECIDES", "Routed", "route"]


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

    route: Route[Any]
    principal: Principal
    task_id: str | None
    data: Input
    stages: dict[int, str] = field(default_factory=dict)
    legacy: dict[str, Routed] = field(default_factory=dict)  # by task: what legacy decided

    def check(self, point: str, ns: core.NamespaceHold) -> None:
        owner_id = self.data.named_owner()
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

    def keeps_claim_keys(self, ns: core.NamespaceHold) -> bool:
        """A claim's Idempotency-Key is answered where claim.v1 decides the grant; where legacy does, its protocol
        has none (docs/workers.md, "Retrying a claim")."""
        return self.stages.get(ns.id) in V1_DECIDES

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
        verdicts = legacy_decisions(each, [ask for ask, _ in accepted], records)
        for (ask, decided), verdict in zip(accepted, verdicts, strict=True):
            if not verdict.accepted and self.route.all_or_none:
                raise _Unwind()
            self.legacy[ask.task_id] = compared(
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
        self, each: TaskOperation, ns: core.NamespaceHold, task_id: str, data: Input, exc: ClaimError,
        records: Records,
    ) -> None:  # fmt: skip
        result = result_to_complete(each, task_id, data)
        if claim_v1_alone(each, task_id, data, ns.scheduler_epoch, ns.claims_paused, result):
            return
        ask = ask_of(each, self.principal, task_id, ns.name, data, None, result=result[1])
        self.legacy[task_id] = compared(each, ask, legacy_decision(each, ask, records), refused(exc), records)


def route(route: Route[Any], *, principal: Principal, task_id: str | None = None, data: Input) -> Any:
    """Serve one claim.v1 worker operation (a row of ``routes.py``) as the namespace's stage says: its Routed
    answer (a list for a batch claim; by item index for a batch commit)."""
    return _route(route, principal, task_id, data)


def _route(
    route: Route[Any], principal: Principal, task_id: str | None, data: Input, reroutes: int = 3
) -> Any:
    interleave.reach("routing.routed")
    hook = _StageHook(route, principal, task_id, data)
    try:
        with legacy_unit(), core.guarded(hook):  # a legacy table elsewhere commits after ours, or rolls back
            value = route.core(principal, task_id, data)
    except _Unwind as unwound:
        if route.shape is Shape.ITEMS:  # each item is routed as its single commit is
            return {}
        if unwound.error is not None:
            raise unwound.error from None
        if route.shape is Shape.BATCH:  # a batch claim met a legacy refusal
            assert isinstance(data, ClaimBatchInput)
            return _claims_one_by_one(principal, data)
        assert task_id is not None
        return _at_legacy(route, principal, task_id, data)
    except Conflict as exc:  # a protocol refusal; a 400, 403 or 404 is the answer in every stage
        if task_id is None or not _legacy_stage_of(hook):
            raise
        return _after_refusal(route, principal, task_id, data, exc, reroutes)
    return _ANSWERS[route.shape](hook, task_id, data, value)


def _one(decided: Routed | None, value: Any) -> Routed:
    """The core's value where claim.v1 decided; legacy's answer (or its refusal) where legacy did."""
    if decided is None:
        return Routed(CLAIM_V1, value)
    if decided.refused:  # legacy's word, with claim.v1's view
        raise legacy_refusal(decided)
    return decided


def _item_answer(decided: Routed | None, answer: Any) -> Any:
    if decided is None:
        return answer
    return legacy_refusal(decided) if decided.refused else decided.fields


def _items(hook: _StageHook, task_id: str | None, data: Input, value: Any) -> dict[int, Any]:
    assert isinstance(data, CommitsInput)
    return {
        index: _item_answer(hook.legacy.get(data.items[index][0]), answer) for index, answer in value.items()
    }


_ANSWERS: dict[Shape, Callable[[_StageHook, str | None, Input, Any], Any]] = {
    Shape.ONE: lambda hook, task_id, data, value: _one(hook.legacy.get(task_id or ""), value),
    Shape.NEXT: lambda hook, task_id, data, value: _one(
        hook.legacy.get(value.task.task_id) if value is not None else None, value
    ),
    Shape.BATCH: lambda hook, task_id, data, value: [
        hook.legacy.get(grant.task.task_id) or Routed(CLAIM_V1, grant) for grant in value
    ],
    Shape.ITEMS: _items,
}


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


def _not_open(name: str) -> StageNotOpen:
    return StageNotOpen(
        f"namespace {name} is at LEGACY: the claim.v1 API is not open yet", current={"stage": Stage.LEGACY}
    )


# --- leaving the one path -------------------------------------------------------------------------------------


def _after_refusal(
    route: Route[Any], principal: Principal, task_id: str, data: Input, exc: Conflict, reroutes: int
) -> Routed:
    """claim.v1 refused where legacy decides: legacy decides in its own transaction, compared with the refusal,
    unless the request is claim.v1's alone (then the refusal is the answer)."""
    each = route.each
    target = namespace_of(task_id, principal)
    ns = target.namespace
    result = result_to_complete(each, task_id, data)
    if target.stage not in LEGACY_DECIDES or claim_v1_alone(
        each, task_id, data, ns.scheduler_epoch, ns.claims_paused, result
    ):
        raise exc
    interleave.reach("routing.refused")
    ask = ask_of(each, principal, task_id, ns.name, data, None, result=result[1])
    v1 = refused(exc)
    decided = legacy_decides(
        each, ask, target, lambda verdict, records: compared(each, ask, verdict, v1, records)
    )
    if decided is None:  # the namespace moved since claim.v1 refused: the request is routed again
        if reroutes == 0:
            raise InvalidTransition(
                "the namespace's stage kept moving under this request: send it again", reason="STAGE_CHANGED"
            )
        return _route(route, principal, task_id, data, reroutes - 1)
    if decided.refused:
        raise legacy_refusal(decided)
    return decided


def _at_legacy(route: Route[Any], principal: Principal, task_id: str, data: Input) -> Routed:
    """The namespace is at LEGACY: claim.v1's API is not open — but a request claim.v1 alone answers (an old
    epoch, a fenced or unknown attempt, nothing to commit) is answered by claim.v1, as in every stage."""
    target = namespace_of(task_id, principal)
    ns, each = target.namespace, route.each
    result = result_to_complete(each, task_id, data)
    if target.stage == Stage.LEGACY and not claim_v1_alone(
        each, task_id, data, ns.scheduler_epoch, ns.claims_paused, result
    ):
        raise _not_open(ns.name)
    return Routed(CLAIM_V1, route.core(principal, task_id, data))


def _claims_one_by_one(principal: Principal, data: ClaimBatchInput) -> list[Routed]:
    """A batch claim that met a legacy refusal (or a namespace at LEGACY): claim-next routed up to ``max_tasks``
    times, each its own decision. A task legacy refuses is left out of the answer — its claim.v1 grant, which the
    worker is never told of, is released at once and the next picks pass it over; the refusal is raised only if
    nothing was granted."""
    passed_over: list[str] = []
    granted: list[Routed] = []
    refusal: LegacyRefused | None = None
    for _ in range(data.max_tasks):
        try:
            routed = route(CLAIM_NEXT_ROUTE, principal=principal, data=data.one_at_a_time(passed_over))
        except LegacyRefused as exc:
            refusal = exc
            _release_unannounced(principal, data.owner_id, exc.extra)
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
