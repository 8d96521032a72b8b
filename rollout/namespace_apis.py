"""The namespace endpoints with the rollout's record of each namespace: stage and protocol minimum. With the
rollout app installed these are the only routes for their paths; the core's own (claim.v1 only) serve them
without it."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from claims import apis as core_apis
from claims import selectors as core_selectors
from claims import serializers as core_s
from claims import services as core
from claims.apis import AuthedRequest, error_responses, paginated, parsed
from claims.models import Namespace
from claims.permissions import AnyRole, IsOncall, IsOperator

from . import selectors
from . import serializers as s
from .services import state


def namespace_fields(namespace: Namespace) -> dict[str, Any]:
    stage, min_protocol = selectors.rollout_state(namespace)
    return {**core_apis.namespace_fields(namespace), "stage": stage, "min_protocol": min_protocol}


class NamespaceListCreateApi(APIView):
    def get_permissions(self):
        return [IsOperator()] if self.request.method == "POST" else [AnyRole()]

    @extend_schema(
        operation_id="namespace_create",
        request=s.NamespaceCreateIn,
        responses={201: s.NamespaceOut, **error_responses(400, 401, 403, 409)},
        description="Epoch 1, stage V1_ONLY unless given (a namespace being migrated from the legacy table is "
        "created at LEGACY). An existing name: 409 NAMESPACE_EXISTS.",
    )
    def post(self, request: AuthedRequest) -> Response:
        data = parsed(s.NamespaceCreateIn, request)
        namespace = state.namespace_create(principal=request.user, **data)
        return Response(s.NamespaceOut(namespace_fields(namespace)).data, status=201)

    @extend_schema(operation_id="namespace_list", responses={200: s.NamespacePage, **error_responses(401)})
    def get(self, request: AuthedRequest) -> Response:
        rows = core_selectors.namespace_list().select_related("rollout")
        return paginated(self, request, rows, lambda ns: s.NamespaceOut(namespace_fields(ns)).data)


class NamespaceDetailApi(APIView):
    permission_classes = [AnyRole]

    @extend_schema(
        operation_id="namespace_get", responses={200: s.NamespaceDetailOut, **error_responses(401, 404)}
    )
    def get(self, request: AuthedRequest, ns: str) -> Response:
        namespace = core_selectors.namespace_get(name=ns)
        # The rollout's drain counts (claim.v1's live leases and the legacy API's): the figures the drain API, the
        # console and the V1_WRITES → V1_ONLY gate use.
        body = {**namespace_fields(namespace), "drain": selectors.drain_counts(namespace)}
        return Response(s.NamespaceDetailOut(body).data)


class NamespaceResumeApi(APIView):
    permission_classes = [IsOncall]

    @extend_schema(
        operation_id="namespace_resume",
        request=core_s.OptionalReasonIn,
        responses={200: s.ResumedOut, **error_responses(400, 401, 403, 404, 409)},
        description="Lift the pause; the epoch stays. Answers `{outcome: RESUMED, ...namespace}`. The reason is "
        "optional and audited with the principal. While a rollback drains, it holds the pause: 409 PAUSE_HELD "
        "(reason ROLLBACK), whoever asks.",
    )
    def post(self, request: AuthedRequest, ns: str) -> Response:
        data = parsed(core_s.OptionalReasonIn, request) if request.data else {}
        namespace = core.namespace_resume(principal=request.user, namespace=ns, **data)
        return Response(s.ResumedOut({"outcome": "RESUMED", **namespace_fields(namespace)}).data)
