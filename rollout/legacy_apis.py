"""The legacy protocol under /api/legacy/ (rollout.md), for today's worker binaries, to worker tokens."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework.response import Response
from rest_framework.serializers import Serializer
from rest_framework.views import APIView

from claims.apis import AuthedRequest, error_responses, parsed
from claims.permissions import IsWorker
from claims.serializers import OutcomeOut

from . import serializers as s
from .services.legacy_api import legacy_operation
from .services.operations import CLAIM, COMPLETE, HEARTBEAT, RELEASE, TaskOperation


def _errors() -> dict:
    return {
        **error_responses(400, 401, 403, 404),
        409: OpenApiResponse(
            s.LegacyRefusedConflictOut,
            description="HELD / NOT_OWNER (with the holder and expiry), PROTOCOL_TOO_OLD from V1_WRITES on, "
            "CLAIMS_PAUSED; FENCED (reason EPOCH) for a heartbeat or complete under a lease granted before an epoch "
            "fence, where legacy decides — legacy is not asked (docs/adopting.md, 'A fence where legacy decides').",
        ),
    }


class _LegacyOperation(APIView):
    """One legacy-API operation: parse, let ``services.legacy_api`` serve it as the stage says (a refusal is its
    typed error), and answer legacy's verdict through ``out``."""

    permission_classes = [IsWorker]
    operation: TaskOperation  # its row of operations.LEGACY_OPERATIONS
    input: type[Serializer]
    out: type[Serializer]

    def post(self, request: AuthedRequest, task_id: str) -> Response:
        data = parsed(self.input, request)
        served = legacy_operation(self.operation, principal=request.user, task_id=task_id, **data)
        return Response(self.out(served.verdict).data)


def _documented(operation_id: str, description: str = "") -> Any:
    def document(view: type[_LegacyOperation]) -> type[_LegacyOperation]:
        post = extend_schema(
            operation_id=operation_id,
            request=view.input,
            tags=["legacy"],
            responses={200: view.out, **_errors()},
            description=description,
        )
        return extend_schema_view(post=post)(view)

    return document


@_documented(
    "legacy_claim",
    "Legacy claim: 200 {owner_id, expires_at}; 409 {outcome: HELD, owner_id, expires_at} while another owner's "
    "claim is unexpired; 409 PROTOCOL_TOO_OLD from V1_WRITES on.",
)
class LegacyClaimApi(_LegacyOperation):
    operation, input, out = CLAIM, s.LegacyClaimIn, s.LegacyClaimedOut


@_documented(
    "legacy_heartbeat",
    "Legacy heartbeat: 200 {expires_at}; 409 NOT_OWNER if the row names another owner; 409 FENCED (EPOCH) under a "
    "lease granted before an epoch fence.",
)
class LegacyHeartbeatApi(_LegacyOperation):
    operation, input, out = HEARTBEAT, s.LegacyClaimIn, s.LegacyHeartbeatOut


@_documented("legacy_release")
class LegacyReleaseApi(_LegacyOperation):
    operation, input, out = RELEASE, s.LegacyReleaseIn, OutcomeOut


@_documented(
    "legacy_complete",
    "Unconditional: last write wins (that is the legacy protocol) — except that, where legacy decides, a complete "
    "under a lease granted before an epoch fence is refused 409 FENCED (EPOCH): the epoch rule holds in every stage.",
)
class LegacyCompleteApi(_LegacyOperation):
    operation, input, out = COMPLETE, s.LegacyCompleteIn, OutcomeOut
