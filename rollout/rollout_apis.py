"""The rollout API (rollout.md): stages and gates, rollback, mismatches, coverage, drain, pools, audit."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from claims.apis import error_responses, paginated, parsed
from claims.models import AuditEntry
from claims.permissions import AnyRole, IsOncall, IsOperator, IsWorker

from . import selectors
from . import serializers as s
from .models import DrainSnapshot, GateEvaluation, Mismatch, Rollback, WorkerRegistration
from .services import stages, workers
from .services.reviews import explain_rule_create, mismatch_review


def _gate_body(gate: stages.Gate | GateEvaluation) -> dict[str, Any]:
    checked_at = gate.checked_at if isinstance(gate, stages.Gate) else gate.at
    return {
        "move": gate.move,
        "holds": gate.holds,
        "figures": gate.figures,
        "why": gate.why,
        "checked_at": checked_at,
        "age_seconds": selectors.age_seconds(checked_at),
    }


def _rollback_body(rollback: Rollback | None) -> dict[str, Any] | None:
    if rollback is None:
        return None
    return {
        "rollback_id": str(rollback.pk),
        "to_stage": rollback.to_stage,
        "step": rollback.step,
        "started_at": rollback.started_at,
        "finished_at": rollback.finished_at,
    }


def _snapshot_body(snapshot: DrainSnapshot) -> dict[str, Any]:
    return {
        "pool": snapshot.pool or None,
        "active_leases": snapshot.active_leases,
        "unknown_effects": snapshot.unknown_effects,
        "awaiting_commit": snapshot.awaiting_commit,
        "clean": snapshot.clean,
        "clean_streak": snapshot.clean_streak,
        "taken_at": snapshot.taken_at,
    }


class RolloutApi(APIView):
    permission_classes = [AnyRole]

    @extend_schema(
        operation_id="rollout_get",
        responses={200: OpenApiResponse(description="stage, gates, rollback"), **error_responses(401, 404)},
        description="The stage, the next stage, and the next move's gate as last recorded (by the `gate_check` "
        "job every GATE_CHECK_SECONDS, and by every advance), with its age. A read records nothing: `gates` is "
        "empty until the first evaluation of this stage's gate.",
    )
    def get(self, request: Request, ns: str) -> Response:
        namespace = stages._namespace(ns)
        stage = selectors.stage_of(namespace)
        gate = selectors.last_gate(namespace, stage)
        running = Rollback.objects.filter(namespace=ns, finished_at__isnull=True).first()
        return Response(
            {
                "namespace": namespace.name,
                "stage": stage,
                "next_stage": selectors.next_stage(stage),
                "scheduler_epoch": namespace.scheduler_epoch,
                "claims_paused": namespace.claims_paused,
                "gates": [_gate_body(gate)] if gate else [],
                "rollback": _rollback_body(running),
            }
        )


class AdvanceApi(APIView):
    permission_classes = [IsOperator]

    @extend_schema(
        operation_id="rollout_advance",
        request=s.AdvanceIn,
        responses={
            200: OpenApiResponse(description="{outcome: ADVANCED, stage, gate}"),
            **error_responses(400, 401, 403, 404, 409),
        },
        description="Move one step when the gate holds: 409 GATE_NOT_MET with current {gate, figures}; "
        "409 INVALID_TRANSITION unless to_stage is the next stage (reason STAGE_CHANGED when the stage moved under "
        "the advance: stage changes are compare-and-set on the stage they start from); 409 ROLLBACK_IN_PROGRESS "
        "while a rollback of the namespace is open, override or not; entering SHADOW while claims are paused is 409 "
        "CLAIMS_PAUSED (the import of live legacy claims would grant nothing). override (oncall, with a reason) "
        "moves anyway and is recorded as an override.",
    )
    def post(self, request: Request, ns: str) -> Response:
        data = parsed(s.AdvanceIn, request)
        stage, gate = stages.advance(principal=request.user, namespace=ns, **data)
        return Response({"outcome": "ADVANCED", "stage": stage, "gate": _gate_body(gate)})


class RollbackApi(APIView):
    permission_classes = [IsOncall]

    @extend_schema(
        operation_id="rollout_rollback",
        request=s.RollbackIn,
        responses={
            200: OpenApiResponse(description="{outcome: ROLLED_BACK, stage, scheduler_epoch}"),
            202: OpenApiResponse(description="{outcome: ROLLBACK_STARTED, rollback, scheduler_epoch}"),
            **error_responses(400, 401, 403, 404, 409),
        },
        description="Epoch fence → namespace-wide drain → stage back → claims stay paused. 202 while the "
        "drain is not clean; re-POST to check again, or with force and a reason to finish anyway.",
    )
    def post(self, request: Request, ns: str) -> Response:
        data = parsed(s.RollbackIn, request)
        rollback = stages.rollback(principal=request.user, namespace=ns, **data)
        namespace = stages._namespace(ns)
        if rollback.finished_at is not None:
            return Response(
                {
                    "outcome": "ROLLED_BACK",
                    "stage": selectors.stage_of(namespace),
                    "scheduler_epoch": namespace.scheduler_epoch,
                }
            )
        drain = DrainSnapshot.objects.filter(namespace=ns, pool="").order_by("-taken_at").first()
        return Response(
            {
                "outcome": "ROLLBACK_STARTED",
                "rollback": _rollback_body(rollback),
                "drain": _snapshot_body(drain) if drain else None,
                "scheduler_epoch": namespace.scheduler_epoch,
            },
            status=202,
        )


class MismatchListApi(APIView):
    permission_classes = [AnyRole]

    @extend_schema(
        operation_id="mismatch_list",
        parameters=[s.MismatchQuery],
        responses={200: s.MismatchPage, **error_responses(400, 401, 404)},
    )
    def get(self, request: Request, ns: str) -> Response:
        stages._namespace(ns)
        query = s.MismatchQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        rows = Mismatch.objects.filter(namespace=ns).order_by("-at", "-id")
        if query.validated_data.get("reason"):
            rows = rows.filter(reason=query.validated_data["reason"])
        if query.validated_data.get("status"):
            rows = rows.filter(status=query.validated_data["status"])
        if query.validated_data.get("since"):
            rows = rows.filter(at__gte=query.validated_data["since"])
        return paginated(self, request, rows, lambda m: s.MismatchOut(m).data)


class MismatchReviewApi(APIView):
    permission_classes = [IsOperator]

    @extend_schema(
        operation_id="mismatch_review",
        request=s.ReviewIn,
        responses={200: s.MismatchOut, **error_responses(400, 401, 403, 404)},
    )
    def post(self, request: Request, mismatch_id: int) -> Response:
        data = parsed(s.ReviewIn, request)
        return Response(
            s.MismatchOut(mismatch_review(principal=request.user, mismatch_id=mismatch_id, **data)).data
        )


class ExplainRuleApi(APIView):
    permission_classes = [IsOperator]

    @extend_schema(
        operation_id="explain_rule_create",
        request=s.ExplainRuleIn,
        responses={201: OpenApiResponse(description="the rule"), **error_responses(400, 401, 403, 404)},
    )
    def post(self, request: Request, ns: str) -> Response:
        data = parsed(s.ExplainRuleIn, request)
        rule = explain_rule_create(principal=request.user, namespace=ns, **data)
        return Response(
            {
                "id": rule.id,
                "namespace": rule.namespace,
                "reason": rule.reason,
                "note": rule.note,
                "created_by": rule.created_by,
                "created_at": rule.created_at,
            },
            status=201,
        )


class CoverageApi(APIView):
    permission_classes = [AnyRole]

    @extend_schema(
        operation_id="coverage_get",
        responses={200: OpenApiResponse(description="coverage"), **error_responses(401, 404)},
    )
    def get(self, request: Request, ns: str) -> Response:
        return Response(selectors.coverage(stages._namespace(ns)))


class WaiveApi(APIView):
    permission_classes = [IsOperator]

    @extend_schema(
        operation_id="coverage_waive",
        request=s.WaiveIn,
        responses={201: OpenApiResponse(description="the waiver"), **error_responses(400, 401, 403, 404)},
    )
    def post(self, request: Request, ns: str) -> Response:
        data = parsed(s.WaiveIn, request)
        waiver = stages.waive_coverage(principal=request.user, namespace=ns, **data)
        return Response(
            {"point": waiver.point, "reason": waiver.reason, "principal": waiver.principal, "at": waiver.at},
            status=201,
        )


class DrainApi(APIView):
    def get_permissions(self):
        return [IsOperator()] if self.request.method == "POST" else [AnyRole()]

    @extend_schema(
        operation_id="drain_get",
        parameters=[s.DrainQuery],
        responses={
            200: OpenApiResponse(
                description="the last snapshot; before any was taken, the counts as they stand (taken_at null)"
            ),
            **error_responses(400, 401, 404),
        },
    )
    def get(self, request: Request, ns: str) -> Response:
        namespace = stages._namespace(ns)
        pool = _pool(request)
        snapshot = DrainSnapshot.objects.filter(namespace=ns, pool=pool).order_by("-taken_at").first()
        if snapshot is None:
            # Nothing recorded yet: the counts as they stand, recorded by nobody (a GET writes no row).
            counts = selectors.drain_counts(namespace, pool=pool or None)
            return Response(
                {
                    "pool": pool or None,
                    **counts,
                    "clean": not any(counts.values()),
                    "clean_streak": 0,
                    "taken_at": None,
                }
            )
        return Response(_snapshot_body(snapshot))

    @extend_schema(
        operation_id="drain_snapshot",
        request=None,
        parameters=[s.DrainQuery],
        responses={201: OpenApiResponse(description="a new snapshot"), **error_responses(400, 401, 403, 404)},
    )
    def post(self, request: Request, ns: str) -> Response:
        pool = _pool(request) or None
        return Response(_snapshot_body(stages.drain_snapshot(namespace=ns, pool=pool)), status=201)


def _pool(request: Request) -> str:
    query = s.DrainQuery(data=request.query_params)
    query.is_valid(raise_exception=True)
    return query.validated_data.get("pool", "")


class PoolsApi(APIView):
    permission_classes = [AnyRole]

    @extend_schema(
        operation_id="pools_list", responses={200: OpenApiResponse(description="pools with workers")}
    )
    def get(self, request: Request) -> Response:
        pools: dict[str, list[dict[str, Any]]] = {}
        for reg in WorkerRegistration.objects.order_by("pool", "principal"):
            pools.setdefault(reg.pool or "", []).append(
                {
                    "principal": reg.principal,
                    "namespace": reg.namespace,
                    "protocol": reg.protocol,
                    "binary_version": reg.binary_version,
                    "refused": reg.refused,
                    "last_heartbeat": reg.last_heartbeat,
                }
            )
        return Response({"results": [{"pool": pool, "workers": items} for pool, items in pools.items()]})


class AuditApi(APIView):
    permission_classes = [IsOperator]

    @extend_schema(operation_id="audit_list", responses={200: OpenApiResponse(description="the audit log")})
    def get(self, request: Request) -> Response:
        rows = AuditEntry.objects.order_by("-at", "-id")
        return paginated(
            self,
            request,
            rows,
            lambda e: {
                "at": e.at,
                "principal": e.principal,
                "role": e.role,
                "action": e.action,
                "namespace": e.namespace,
                "target": e.target,
                "reason": e.reason,
                "detail": e.detail,
            },
        )


class RegisterApi(APIView):
    permission_classes = [IsWorker]

    @extend_schema(
        operation_id="worker_register",
        request=s.RegisterIn,
        responses={
            201: OpenApiResponse(description="registered"),
            **error_responses(400, 401, 403, 404, 409),
        },
        description="409 PROTOCOL_TOO_OLD when the protocol is older than the namespace requires "
        "(claim.v1 from V1_WRITES on, or per min_protocol); the worker's claims are then refused until "
        "it registers again with a newer protocol.",
    )
    def post(self, request: Request) -> Response:
        data = parsed(s.RegisterIn, request)
        reg = workers.worker_register(principal=request.user, **data)
        return Response(
            {
                "outcome": "REGISTERED",
                "namespace": reg.namespace,
                "protocol": reg.protocol,
                "pool": reg.pool,
                "binary_version": reg.binary_version,
            },
            status=201,
        )


class HeartbeatApi(APIView):
    permission_classes = [IsWorker]

    @extend_schema(
        operation_id="worker_heartbeat",
        request=s.HeartbeatIn,
        responses={200: OpenApiResponse(description="ok"), **error_responses(400, 401, 403, 404, 409)},
    )
    def post(self, request: Request) -> Response:
        data = parsed(s.HeartbeatIn, request)
        reg = workers.worker_heartbeat(principal=request.user, **data)
        return Response({"outcome": "HEARTBEAT", "last_heartbeat": reg.last_heartbeat})
