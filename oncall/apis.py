"""The on-call tools' API: the epoch fence — through the same durable request and self-check as the console and
the CLI — and the audit log."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse
from rest_framework.response import Response
from rest_framework.views import APIView

from claims.apis import AuthedRequest, operation, paginated, parsed
from claims.models import AuditEntry
from claims.permissions import IsOncall, IsOperator
from claims.serializers import ReasonIn

from . import serializers as s
from .services import fence_now


class NamespaceFenceApi(APIView):
    permission_classes = [IsOncall]

    @operation(
        "namespace_fence",
        OpenApiResponse(
            s.FenceOut,
            description="The contract's body. Headers: `Fence-Id`, the recorded request (console: Fences; the "
            "audit log); `Fence-Self-Check`, `ok` or `failed: <detail>` (the epoch was bumped all the same: "
            "look at the fence).",
        ),
        (400, 401, 403, 404),
        request=ReasonIn,
        description="Stop new claims and bump scheduler_epoch. From then every acceptance point rejects the old "
        "epoch and every attempt granted under it — even when it re-sends the new epoch. The fence is recorded "
        "as a request first and checked after (an old-epoch commit must come back FENCED), as the console's and "
        "the CLI's are.",
    )
    def post(self, request: AuthedRequest, ns: str) -> Response:
        data = parsed(ReasonIn, request)
        done = fence_now(principal=request.user, namespace=ns, **data)
        check = done.self_check or {}
        response = Response(s.FenceOut({"scheduler_epoch": done.scheduler_epoch, "claims_paused": True}).data)
        response["Fence-Id"] = str(done.fence_id)
        response["Fence-Self-Check"] = "ok" if check.get("ok") else f"failed: {check.get('detail', '')}"
        return response


class AuditApi(APIView):
    permission_classes = [IsOperator]

    @operation("audit_list", s.AuditPage, ())
    def get(self, request: AuthedRequest) -> Response:
        rows = AuditEntry.objects.order_by("-at", "-id")
        return paginated(self, request, rows, lambda e: s.AuditOut(e).data)
