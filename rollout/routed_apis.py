"""The claim.v1 worker operations and reads, routed by the namespace's rollout stage (rollout.md). These views
subclass the core's and are mounted in front of them for the same paths; the core never knows."""

from __future__ import annotations

from django.db import transaction
from rest_framework.request import Request
from rest_framework.response import Response

from claims import apis as core_apis
from claims import clock
from claims import selectors as core_selectors
from claims import serializers as core_s
from claims import services as core
from claims.apis import _valid
from claims.errors import Invalid
from claims.models import Namespace, Stage, StagedResult

from .legacy import legacy_store
from .reads import legacy_view, with_legacy_state
from .services import StageNotOpen, V1Verdict, _refuse_refused_worker, compare, record_legacy, routed_v1


def _shaped(routed, core_answer) -> Response:
    if routed.status == -1:  # V1_WRITES: the core decided; its own answer
        return core_answer(routed.body["value"])
    return Response(routed.body, status=routed.status)


class RoutedClaimApi(core_apis.TaskClaimApi):
    def post(self, request: Request, task_id: str) -> Response:
        data = _valid(core_s.ClaimIn, request)
        p = request.user
        routed = routed_v1(
            "claim",
            principal=p,
            task_id=task_id,
            scheduler_epoch=data["scheduler_epoch"],
            owner_id=data["owner_id"],
            success_word="CLAIMED",
            v1_call=lambda: core.task_claim(principal=p, task_id=task_id, **data),
            legacy_call=lambda store, ns, now: store.claim(
                task_id=task_id,
                namespace=ns.name,
                owner_id=data["owner_id"],
                ttl_seconds=data["ttl_seconds"],
                now=now,
                pool=p.pool,
                via="claim.v1",
            ),
            v1_write_through=lambda store, ns, now, grant: store.record_claim(
                task_id=task_id,
                namespace=ns.name,
                owner_id=grant.task.owner_id,
                expires_at=grant.task.lease_expires_at,
                now=now,
                pool=p.pool,
            ),
        )
        if routed is None:
            return super().post(request, task_id)
        return _shaped(routed, lambda grant: Response(core_apis.claim_body(grant)))


class RoutedRenewApi(core_apis.TaskRenewApi):
    def post(self, request: Request, task_id: str) -> Response:
        data = _valid(core_s.RenewIn, request)
        p = request.user
        routed = routed_v1(
            "renew",
            principal=p,
            task_id=task_id,
            attempt_id=data["attempt_id"],
            scheduler_epoch=data["scheduler_epoch"],
            owner_id=data["owner_id"],
            success_word="RENEWED",
            v1_call=lambda: core.task_renew(principal=p, task_id=task_id, **data),
            legacy_call=lambda store, ns, now: store.heartbeat(
                task_id=task_id, owner_id=data["owner_id"], ttl_seconds=data["extend_seconds"], now=now
            ),
            v1_write_through=lambda store, ns, now, task: store.record_claim(
                task_id=task_id,
                namespace=ns.name,
                owner_id=task.owner_id,
                expires_at=task.lease_expires_at,
                now=now,
                pool=p.pool,
            ),
        )
        if routed is None:
            return super().post(request, task_id)
        return _shaped(
            routed, lambda task: Response({"outcome": "RENEWED", "lease_expires_at": task.lease_expires_at})
        )


class RoutedReleaseApi(core_apis.TaskReleaseApi):
    def post(self, request: Request, task_id: str) -> Response:
        data = _valid(core_s.ReleaseIn, request)
        p = request.user
        routed = routed_v1(
            "release",
            principal=p,
            task_id=task_id,
            attempt_id=data["attempt_id"],
            scheduler_epoch=data["scheduler_epoch"],
            owner_id=data["owner_id"],
            success_word="RELEASED",
            v1_call=lambda: core.task_release(principal=p, task_id=task_id, **data),
            legacy_call=lambda store, ns, now: store.release(
                task_id=task_id, owner_id=data["owner_id"], now=now
            ),
            v1_write_through=lambda store, ns, now, task: store.record_claim(
                task_id=task_id, namespace=ns.name, owner_id="", expires_at=None, now=now
            ),
        )
        if routed is None:
            return super().post(request, task_id)
        return _shaped(routed, lambda task: Response({"outcome": "RELEASED"}))


class RoutedCommitApi(core_apis.TaskCommitApi):
    def post(self, request: Request, task_id: str) -> Response:
        data = _valid(core_s.CommitIn, request)
        p = request.user
        # The staged result of *this* task's attempt: where legacy decides, a commit is a legacy complete with it.
        # Without one there is nothing to complete with: the core answers (NOT_STAGED, or an earlier refusal).
        staged = StagedResult.objects.filter(
            task_id=task_id, attempt_id=data["attempt_id"], result_digest=data["result_digest"]
        ).first()

        def complete(store, ns, now):
            # A claim.v1 commit where legacy decides is a legacy `complete` by the attempt's owner with that
            # attempt's staged result.
            return store.complete(
                task_id=task_id,
                namespace=ns.name,
                owner_id=p.owner_id,
                result=staged.result if staged else None,
                result_digest=data["result_digest"],
                now=now,
                via="claim.v1",
            )

        routed = routed_v1(
            "commit",
            principal=p,
            task_id=task_id,
            attempt_id=data["attempt_id"],
            scheduler_epoch=data["scheduler_epoch"],
            owner_id=p.owner_id,
            success_word="COMMITTED",
            v1_call=lambda: core.task_commit(principal=p, task_id=task_id, **data),
            legacy_call=complete,
            v1_write_through=lambda store, ns, now, committed: complete(store, ns, now),
            core_refuses=staged is None,
        )
        if routed is None:
            return super().post(request, task_id)
        return _shaped(
            routed,
            lambda c: Response(
                {
                    "outcome": "COMMITTED",
                    "result_commit_id": str(c.result_commit_id),
                    "unblocked": c.unblocked,
                }
            ),
        )


# Same operations, same documented schema as the core's views (the stage routing is described in
# docs/rollout.md and in the API description).
for _routed, _core in (
    (RoutedClaimApi, core_apis.TaskClaimApi),
    (RoutedRenewApi, core_apis.TaskRenewApi),
    (RoutedReleaseApi, core_apis.TaskReleaseApi),
    (RoutedCommitApi, core_apis.TaskCommitApi),
):
    _routed.post.kwargs = dict(_core.post.kwargs)


class RoutedTaskDetailApi(core_apis.TaskDetailApi):
    def get(self, request: Request, task_id: str) -> Response:
        task = core_selectors.task_get(task_id=task_id)
        return Response(legacy_view(task, core_apis.task_body(task)))


class RoutedTaskListApi(core_apis.TaskListCreateApi):
    def get(self, request: Request) -> Response:
        query = core_s.TaskListQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        state = query.validated_data.get("state")
        tasks = with_legacy_state(core_selectors.task_list(namespace=query.validated_data.get("namespace")))
        if state:
            tasks = tasks.filter(read_state=state)
        return core_apis._paginated(self, request, tasks, lambda t: legacy_view(t, core_apis.task_body(t)))


RoutedTaskDetailApi.get.kwargs = dict(core_apis.TaskDetailApi.get.kwargs)
RoutedTaskListApi.get.kwargs = dict(core_apis.TaskListCreateApi.get.kwargs)


class RoutedClaimNextApi(core_apis.ClaimNextApi):
    """Claim-next by stage: LEGACY refuses it; SHADOW/V1_READS let claim.v1 pick (its SKIP LOCKED frontier) and
    legacy decide the grant; V1_WRITES writes claim.v1's grant through to the legacy store."""

    def post(self, request: Request) -> Response:
        data = _valid(core_s.ClaimNextIn, request)
        p = request.user
        ns = Namespace.objects.filter(name=data.get("namespace", "default")).first()
        if ns is None:
            raise Invalid({"namespace": [f"unknown namespace {data.get('namespace')!r}"]})
        _refuse_refused_worker(p, ns)
        if ns.stage == Stage.LEGACY:
            raise StageNotOpen(
                f"namespace {ns.name} is at LEGACY: the claim.v1 API is not open yet",
                current={"stage": ns.stage},
            )
        if ns.stage == Stage.V1_ONLY or data["scheduler_epoch"] != ns.scheduler_epoch or ns.claims_paused:
            return super().post(request)
        grant = core.task_claim_next(principal=p, **data)
        if grant is None:
            return Response(status=204)
        task = grant.task
        with transaction.atomic(durable=True):
            now = clock.now()
            store = legacy_store()
            if ns.stage == Stage.V1_WRITES:
                store.record_claim(
                    task_id=task.task_id,
                    namespace=ns.name,
                    owner_id=task.owner_id,
                    expires_at=task.lease_expires_at,
                    now=now,
                    pool=p.pool,
                )
                return Response(core_apis.claim_body(grant))
            verdict = store.claim(
                task_id=task.task_id,
                namespace=ns.name,
                owner_id=p.owner_id,
                ttl_seconds=data["ttl_seconds"],
                now=now,
                pool=p.pool,
                via="claim.v1",
            )
            record_legacy(ns, task.task_id, "claim", "claim.v1", p.owner_id, verdict, now)
        v1 = V1Verdict(
            True, "CLAIMED", attempt_id=str(grant.attempt_id), claim_generation=task.claim_generation
        )
        mismatch = compare(
            namespace=ns.name,
            task_id=task.task_id,
            operation="claim",
            api="claim.v1",
            owner_id=p.owner_id,
            legacy=verdict,
            v1=v1,
        )
        body = {
            **core_apis.claim_body(grant),
            "decided_by": "legacy",
            "shadow": {
                "verdict": "CLAIMED",
                "reason": "CLAIMED",
                "mismatch_id": mismatch.id if mismatch else None,
            },
        }
        if verdict.accepted:
            return Response(body)
        return Response(
            {
                **body,
                "outcome": verdict.word,
                "reason": verdict.word,
                "detail": "legacy refused",
                "current": {
                    "owner_id": verdict.owner_id,
                    "expires_at": verdict.expires_at.isoformat() if verdict.expires_at else None,
                },
            },
            status=409,
        )


RoutedClaimNextApi.post.kwargs = dict(core_apis.ClaimNextApi.post.kwargs)
