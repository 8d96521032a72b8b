"""The effect ledger and resource registry endpoints (claim-v1.md §6, §7). One thin view per operation."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse
from rest_framework.response import Response
from rest_framework.views import APIView

from . import effect_serializers as es
from . import serializers as s
from . import services
from .apis import AuthedRequest, ServiceCall, documented, operation, parsed
from .errors import NotFound
from .models import Effect
from .permissions import AnyRole, IsOperator, IsWorker, _RoleIn


def _effect_body(effect: Effect, outcome: str) -> dict[str, Any]:
    return {
        "outcome": outcome,
        "effect_id": effect.effect_id,
        "state": effect.state,
        "payload_digest": effect.payload_digest,
        "idempotency_key": effect.effect_id,
    }


@documented(
    "effect_prepare",
    {
        201: OpenApiResponse(es.EffectOut, description="A new record, PREPARED and bound to payload_digest."),
        200: OpenApiResponse(
            es.EffectOut,
            description="Same digest: PREPARED | RECONCILE_REQUIRED | ALREADY_COMMITTED (a FAILED effect is PREPARED "
            "again).",
        ),
        202: OpenApiResponse(es.EffectOut, description="NON_REPLAYABLE: APPROVAL_REQUIRED until approved."),
    },
    "Authority: the current, unfenced, unexpired attempt of an uncancelled task (else 409 CANCELLED or FENCED). "
    "Another digest for the slot: 409 PAYLOAD_CONFLICT with current {effect_id, state, bound_payload_digest}. Send "
    "`idempotency_key` (= effect_id) and your claim_generation downstream.",
)
class EffectPrepareApi(ServiceCall):
    permission_classes = [IsWorker]
    input, service = es.EffectPrepareIn, staticmethod(services.effect_prepare)

    @staticmethod
    def body(prepared: Any) -> dict[str, Any]:
        body = _effect_body(prepared.effect, prepared.outcome)
        if prepared.outcome == "APPROVAL_REQUIRED":
            body.pop("idempotency_key")  # not to be used until an operator approves
        return body

    def status_of(self, prepared: Any) -> int:
        if prepared.outcome == "APPROVAL_REQUIRED":
            return 202
        return 201 if prepared.created else 200


class EffectDetailApi(APIView):
    permission_classes = [AnyRole]

    @operation("effect_get", es.EffectDetailOut, (401, 404))
    def get(self, request: AuthedRequest, effect_id: str) -> Response:
        effect = Effect.objects.filter(pk=effect_id).first()
        if effect is None:
            raise NotFound("no such effect")
        body = es.EffectDetailOut(effect).data
        body["history"] = es.EffectHistoryOut(effect.history.order_by("id"), many=True).data
        return Response(body)


@documented(
    "effect_approve",
    s.OutcomeOut,
    "Approve a NON_REPLAYABLE effect (idempotent). 409 INVALID_TRANSITION for a COMMITTED effect or "
    "one of a REPLAYABLE task.",
)
class EffectApproveApi(ServiceCall):
    permission_classes = [IsOperator]
    input, service = es.EffectApproveIn, staticmethod(services.effect_approve)
    body = staticmethod(lambda effect: {"outcome": "APPROVED"})


@documented(
    "effect_outcome",
    s.OutcomeOut,
    "Record what happened: COMMITTED, FAILED (a definite refusal) or UNKNOWN (a timeout — never "
    "FAILED). From PREPARED or UNKNOWN (else INVALID_TRANSITION). Accepted from the current attempt, and from "
    "the attempt that prepared or dispatched the effect even after it was fenced — about its own part only: once "
    "anyone else has acted on the effect since (a replacement prepared, dispatched or reconciled it; an "
    "operator reconciled it), an older attempt's report is 409 FENCED (ATTEMPT). While a dispatch of the effect "
    "is in flight its delivery records the outcome: a report is 409 INVALID_TRANSITION (DISPATCH_IN_FLIGHT).",
)
class EffectOutcomeApi(ServiceCall):
    permission_classes = [IsWorker]
    input, service = es.EffectOutcomeIn, staticmethod(services.effect_record_outcome)
    body = staticmethod(lambda effect: {"outcome": "RECORDED", "state": effect.state})


class _WorkerOrOperator(_RoleIn):
    roles = frozenset({"worker", "operator", "oncall"})


class EffectReconcileApi(APIView):
    permission_classes = [_WorkerOrOperator]

    @operation(
        "effect_reconcile",
        s.OutcomeOut,
        request=es.EffectReconcileIn,
        description="Only from UNKNOWN (else 409 NOT_UNKNOWN). OCCURRED → COMMITTED; NOT_OCCURRED → PREPARED, to be "
        "executed under the same key. By the current attempt (a worker names it) or by an operator (audited with "
        "its `reason`). An operator's NOT_OCCURRED without a `reason` is 400: it sends the effect again, and the "
        "target may have acted.",
    )
    def post(self, request: AuthedRequest, effect_id: str) -> Response:
        serializer = es.EffectReconcileIn(data=request.data, context={"principal": request.user})
        serializer.is_valid(raise_exception=True)
        effect = services.effect_reconcile(
            principal=request.user, effect_id=effect_id, **serializer.validated_data
        )
        return Response({"outcome": "RECONCILED", "state": effect.state})


@documented(
    "effect_dispatch",
    OpenApiResponse(s.DispatchRecordedOut, description="`{outcome: DISPATCH_RECORDED, dispatch_id}`"),
    "Record the durable dispatch commitment, checked in one transaction: authority; "
    "digest(payload) = bound digest (PAYLOAD_CONFLICT); PREPARED (INVALID_TRANSITION), approved if "
    "NON_REPLAYABLE (APPROVAL_REQUIRED) and no other effect of the node in flight (INVALID_TRANSITION, "
    "NODE_BUSY); no newer claim took the task's resources (STALE_INPUT, RESOURCE). A Celery job then POSTs "
    "the payload with Idempotency-Key, X-Claim-Generation and X-Fence-Token headers. `target` must be "
    "http(s) on DISPATCH_ALLOWED_HOSTS (400). A repeat while the intent is in flight returns it.",
)
class EffectDispatchApi(ServiceCall):
    permission_classes = [IsWorker]
    input, service = es.EffectDispatchIn, staticmethod(services.effect_dispatch)
    body = staticmethod(lambda recorded: s.DispatchRecordedOut({"dispatch_id": recorded[0].pk}).data)
    status = 201


def _resource_body(view: services.ResourceView) -> dict[str, Any]:
    return {
        "resource_key": view.resource_key,
        "incarnation": str(view.incarnation),
        "revision": view.revision,
        "fence_token": view.fence_token,
        "holder": view.holder,
    }


class ResourceCreateApi(APIView):
    permission_classes = [IsOperator]

    @operation(
        "resource_create",
        {201: es.ResourceOut},
        (400, 401, 403, 409),
        request=es.ResourceCreateIn,
        description="A new incarnation at revision 0; the key's fence token carries on. A live key: RESOURCE_EXISTS.",
    )
    def post(self, request: AuthedRequest) -> Response:
        data = parsed(es.ResourceCreateIn, request)
        view = services.resource_create(principal=request.user, **data)
        body = _resource_body(view)
        body.pop("holder")
        return Response(body, status=201)


class ResourceDetailApi(APIView):
    def get_permissions(self):
        return [IsOperator()] if self.request.method == "DELETE" else [AnyRole()]

    @operation(
        "resource_get",
        es.ResourceOut,
        (401, 404),
        description="The live incarnation, its revision, the newest fence token and the attempt holding it.",
    )
    def get(self, request: AuthedRequest, key: str) -> Response:
        return Response(_resource_body(services.resource_get(resource_key=key)))

    @operation(
        "resource_delete",
        {204: None},
        (401, 403, 404),
        description="End the incarnation. Creating the key again starts a new one at revision 0.",
    )
    def delete(self, request: AuthedRequest, key: str) -> Response:
        services.resource_delete(principal=request.user, resource_key=key)
        return Response(status=204)


class ResourceCheckApi(APIView):
    permission_classes = [AnyRole]

    @operation(
        "resource_check",
        s.OutcomeOut,
        (400, 401, 404, 409),
        request=es.ResourceCheckIn,
        description="Advisory, in order: 409 STALE_INPUT (INCARNATION); 409 STALE_FENCE unless the token is the "
        "newest and the attempt that took it is live; 409 STALE_INPUT (REVISION); else 200 CURRENT. Receivers "
        "that can should enforce the token atomically in their own database (claim_client.receiver, the SDK in clients/python).",
    )
    def post(self, request: AuthedRequest, key: str) -> Response:
        data = parsed(es.ResourceCheckIn, request)
        services.resource_check(resource_key=key, **data)
        return Response({"outcome": "CURRENT"})
