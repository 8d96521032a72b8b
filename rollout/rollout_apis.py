"""The rollout API (rollout.md): stages and gates, advance and rollback, shadow mismatches and their review,
coverage and waivers, drain, pools, the audit log, worker registration. Thin: parse, call one service or
selector, answer with the output serializer the schema names."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from claims.apis import AuthedRequest, ServiceCall, documented, operation, paginated, parsed
from claims.permissions import AnyRole, IsOncall, IsOperator, IsReviewer, IsWorker
from oncall.selectors import age_seconds

from . import selectors
from . import serializers as s
from .models import GateEvaluation, Rollback
from .services import stages, workers
from .services.reviews import explain_rule_create, mismatch_review

_NS = {"ns": "namespace"}  # the URL's namespace, as the services name it


def _gate(gate: stages.Gate | GateEvaluation) -> dict[str, Any]:
    checked_at = gate.checked_at if isinstance(gate, stages.Gate) else gate.at
    return {
        "move": gate.move,
        "holds": gate.holds,
        "figures": gate.figures,
        "why": gate.why,
        "checked_at": checked_at,
        "age_seconds": age_seconds(checked_at),
    }


class RolloutApi(APIView):
    permission_classes = [AnyRole]

    @operation(
        "rollout_get",
        s.RolloutOut,
        (401, 404),
        description="The stage, the next stage, and the next move's gate as last recorded (by the `gate_check` "
        "job, and by every advance), with its age. A read records nothing: `gates` is empty until the first "
        "evaluation of this stage's gate.",
    )
    def get(self, request: AuthedRequest, ns: str) -> Response:
        namespace = selectors.namespace_or_404(ns)
        stage = selectors.stage_of(namespace)
        gate = selectors.last_gate(namespace, stage)
        body = {
            "namespace": namespace.name,
            "stage": stage,
            "next_stage": selectors.next_stage(stage),
            "scheduler_epoch": namespace.scheduler_epoch,
            "claims_paused": namespace.claims_paused,
            "gates": [_gate(gate)] if gate else [],
            "rollback": selectors.open_rollback(ns),
        }
        return Response(s.RolloutOut(body).data)


@documented(
    "rollout_advance",
    s.AdvancedOut,
    "Move one step when the gate holds (judged afresh, and recorded): 409 GATE_NOT_MET with current "
    "{gate, figures}; 409 INVALID_TRANSITION unless to_stage is the next stage (reason STAGE_CHANGED when the "
    "stage moved under the advance: stage changes are compare-and-set on the stage they start from); 409 "
    "ROLLBACK_IN_PROGRESS while a rollback of the namespace is open, override or not; entering SHADOW while "
    "claims are paused is 409 CLAIMS_PAUSED (the import of live legacy claims would grant nothing). override "
    "(oncall, with a reason) moves anyway and is recorded as an override.",
)
class AdvanceApi(ServiceCall):
    permission_classes = [IsOperator]
    input, service, as_named = s.AdvanceIn, staticmethod(stages.advance), _NS
    body = staticmethod(
        lambda moved: s.AdvancedOut({"outcome": "ADVANCED", "stage": moved[0], "gate": _gate(moved[1])}).data
    )


class RollbackApi(APIView):
    permission_classes = [IsOncall]

    @operation(
        "rollout_rollback",
        {200: s.RolledBackOut, 202: s.RollbackStartedOut},
        request=s.RollbackIn,
        description="Epoch fence → namespace-wide drain → stage back → claims stay paused. 202 while the "
        "drain is not clean: the advance_rollback job finishes it at the first clean drain (its progress is on "
        "`GET …/rollout`). A second rollback while one is open checks the drain again: 200 ROLLED_BACK if it is "
        "clean now (or with force and a reason: finished without a clean drain, recorded), else 409 "
        "ROLLBACK_IN_PROGRESS with the open one's step — it starts nothing; so is one naming another to_stage.",
    )
    def post(self, request: AuthedRequest, ns: str) -> Response:
        data = parsed(s.RollbackIn, request)
        rollback: Rollback = stages.rollback(principal=request.user, namespace=ns, **data)
        namespace = selectors.namespace_or_404(ns)
        if rollback.finished_at is not None:
            body = {
                "outcome": "ROLLED_BACK",
                "stage": selectors.stage_of(namespace),
                "scheduler_epoch": namespace.scheduler_epoch,
            }
            return Response(s.RolledBackOut(body).data)
        snapshot = selectors.last_snapshot(ns)
        body = {
            "outcome": "ROLLBACK_STARTED",
            "rollback": rollback,
            "drain": selectors.drain_now(namespace) if snapshot else None,
            "scheduler_epoch": namespace.scheduler_epoch,
        }
        return Response(s.RollbackStartedOut(body).data, status=202)


class MismatchListApi(APIView):
    permission_classes = [AnyRole]

    @operation("mismatch_list", s.MismatchPage, (400, 401, 404), parameters=[s.MismatchQuery])
    def get(self, request: AuthedRequest, ns: str) -> Response:
        selectors.namespace_or_404(ns)
        query = s.MismatchQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        rows = selectors.mismatches(ns, **query.validated_data)
        return paginated(self, request, rows, lambda m: s.MismatchOut(m).data)


@documented(
    "mismatch_review",
    s.MismatchOut,
    "Mark a mismatch EXPLAINED (a note is required) or BUG. Reviewers, operators and oncall. A "
    "mismatch already in that status is 409 INVALID_TRANSITION (its review and note are kept).",
)
class MismatchReviewApi(ServiceCall):
    permission_classes = [IsReviewer]
    input, service = s.ReviewIn, staticmethod(mismatch_review)
    body = staticmethod(lambda mismatch: s.MismatchOut(mismatch).data)


@documented("explain_rule_create", s.ExplainRuleOut, errors=(400, 401, 403, 404))
class ExplainRuleApi(ServiceCall):
    permission_classes = [IsReviewer]
    input, service, as_named = s.ExplainRuleIn, staticmethod(explain_rule_create), _NS
    body, status = staticmethod(lambda rule: s.ExplainRuleOut(rule).data), 201


class CoverageApi(APIView):
    permission_classes = [AnyRole]

    @operation("coverage_get", s.CoverageOut, (401, 404))
    def get(self, request: AuthedRequest, ns: str) -> Response:
        return Response(s.CoverageOut(selectors.coverage(selectors.namespace_or_404(ns))).data)


@documented("coverage_waive", s.WaiverOut, errors=(400, 401, 403, 404))
class WaiveApi(ServiceCall):
    permission_classes = [IsOperator]
    input, service, as_named = s.WaiveIn, staticmethod(stages.waive_coverage), _NS
    body, status = staticmethod(lambda waiver: s.WaiverOut(waiver).data), 201


def _pool(request: Request) -> str:
    query = s.DrainQuery(data=request.query_params)
    query.is_valid(raise_exception=True)
    return query.validated_data.get("pool", "")


class DrainApi(APIView):
    def get_permissions(self):
        return [IsOperator()] if self.request.method == "POST" else [AnyRole()]

    @operation(
        "drain_get",
        OpenApiResponse(
            s.SnapshotOut,
            description="the last snapshot; before any was taken, the counts as they stand (taken_at null)",
        ),
        (400, 401, 404),
        parameters=[s.DrainQuery],
    )
    def get(self, request: AuthedRequest, ns: str) -> Response:
        namespace = selectors.namespace_or_404(ns)
        return Response(s.SnapshotOut(selectors.drain_now(namespace, _pool(request))).data)

    @operation(
        "drain_snapshot", {201: s.SnapshotOut}, (400, 401, 403, 404), request=None, parameters=[s.DrainQuery]
    )
    def post(self, request: AuthedRequest, ns: str) -> Response:
        pool = _pool(request)
        stages.drain_snapshot(namespace=ns, pool=pool or None)
        return Response(
            s.SnapshotOut(selectors.drain_now(selectors.namespace_or_404(ns), pool)).data, status=201
        )


class PoolsApi(APIView):
    permission_classes = [AnyRole]

    @operation("pools_list", s.PoolsOut, ())
    def get(self, request: AuthedRequest) -> Response:
        return Response(s.PoolsOut({"results": selectors.pools()}).data)


@documented(
    "worker_register",
    s.RegisteredOut,
    "409 PROTOCOL_TOO_OLD when the protocol is older than the namespace requires (claim.v1 from V1_WRITES on, or "
    "per min_protocol); the worker's claims are then refused until it registers again with a newer protocol.",
)
class RegisterApi(ServiceCall):
    permission_classes = [IsWorker]
    input, service, status = s.RegisterIn, staticmethod(workers.worker_register), 201
    body = staticmethod(lambda reg: s.RegisteredOut(reg).data)


@documented("worker_heartbeat", s.WorkerHeartbeatOut)
class HeartbeatApi(ServiceCall):
    permission_classes = [IsWorker]
    input, service = s.HeartbeatIn, staticmethod(workers.worker_heartbeat)
    body = staticmethod(lambda reg: s.WorkerHeartbeatOut(reg).data)
