"""The legacy protocol under /api/legacy/ (rollout.md), for today's worker binaries, to worker tokens."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from claims.apis import AuthedRequest, error_responses, parsed
from claims.permissions import IsWorker
from claims.serializers import OutcomeOut

from . import serializers as s
from .services.errors import LegacyRefused
from .services.legacy_api import LegacyAnswer, legacy_operation


def _answer(answer: LegacyAnswer, out: type, ok_body: dict) -> Response:
    """Legacy's verdict: its answer through ``out``, or its refusal word (HELD, NOT_OWNER) as a typed 409."""
    verdict = answer.verdict
    if not verdict.accepted:
        held = {"owner_id": verdict.owner_id, "expires_at": verdict.expires_at}
        raise LegacyRefused(
            verdict.word,
            "another owner holds the claim" if verdict.word == "HELD" else "the claim names another owner",
            current=held,
            extra=held,
        )
    return Response(out(ok_body).data)


def _errors() -> dict:
    return {
        **error_responses(400, 401, 403, 404),
        409: OpenApiResponse(
            s.LegacyRefusedConflictOut,
            description="HELD / NOT_OWNER (with the holder and expiry), PROTOCOL_TOO_OLD from V1_WRITES on, "
            "CLAIMS_PAUSED.",
        ),
    }


class LegacyClaimApi(APIView):
    permission_classes = [IsWorker]

    @extend_schema(
        operation_id="legacy_claim",
        request=s.LegacyClaimIn,
        tags=["legacy"],
        responses={200: s.LegacyClaimedOut, **_errors()},
        description="Legacy claim: 200 {owner_id, expires_at}; 409 {outcome: HELD, owner_id, expires_at} "
        "while another owner's claim is unexpired; 409 PROTOCOL_TOO_OLD from V1_WRITES on.",
    )
    def post(self, request: AuthedRequest, task_id: str) -> Response:
        data = parsed(s.LegacyClaimIn, request)
        answer = legacy_operation("claim", principal=request.user, task_id=task_id, **data)
        return _answer(
            answer,
            s.LegacyClaimedOut,
            {"owner_id": answer.verdict.owner_id, "expires_at": answer.verdict.expires_at},
        )


class LegacyHeartbeatApi(APIView):
    permission_classes = [IsWorker]

    @extend_schema(
        operation_id="legacy_heartbeat",
        request=s.LegacyClaimIn,
        tags=["legacy"],
        responses={200: s.LegacyHeartbeatOut, **_errors()},
    )
    def post(self, request: AuthedRequest, task_id: str) -> Response:
        data = parsed(s.LegacyClaimIn, request)
        answer = legacy_operation("heartbeat", principal=request.user, task_id=task_id, **data)
        return _answer(answer, s.LegacyHeartbeatOut, {"expires_at": answer.verdict.expires_at})


class LegacyReleaseApi(APIView):
    permission_classes = [IsWorker]

    @extend_schema(
        operation_id="legacy_release",
        request=s.LegacyReleaseIn,
        tags=["legacy"],
        responses={200: OutcomeOut, **_errors()},
    )
    def post(self, request: AuthedRequest, task_id: str) -> Response:
        data = parsed(s.LegacyReleaseIn, request)
        answer = legacy_operation("release", principal=request.user, task_id=task_id, **data)
        return _answer(answer, OutcomeOut, {"outcome": "RELEASED"})


class LegacyCompleteApi(APIView):
    permission_classes = [IsWorker]

    @extend_schema(
        operation_id="legacy_complete",
        request=s.LegacyCompleteIn,
        tags=["legacy"],
        responses={200: OutcomeOut, **_errors()},
        description="Unconditional: last write wins (that is the legacy protocol).",
    )
    def post(self, request: AuthedRequest, task_id: str) -> Response:
        data = parsed(s.LegacyCompleteIn, request)
        answer = legacy_operation("complete", principal=request.user, task_id=task_id, **data)
        return _answer(answer, OutcomeOut, {"outcome": "COMPLETED"})
