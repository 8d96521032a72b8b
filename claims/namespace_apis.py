"""The namespace endpoints as the core alone serves them (a wrapping app subclasses them: rollout/namespace_apis.py)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from rest_framework.response import Response
from rest_framework.serializers import Serializer
from rest_framework.views import APIView

from . import selectors, services
from . import serializers as s
from .apis import AuthedRequest, namespace_fields, operation, paginated, parsed
from .models import Namespace, Principal
from .permissions import AnyRole, IsOncall, IsOperator


class _DescribesNamespaces:
    """How a namespace view describes one: the core alone reports claim.v1 only; the rollout app's subclasses
    (rollout/namespace_apis.py) report its record of the namespace with their own serializers."""

    out: type[Serializer] = s.NamespaceOut
    detail_out: type[Serializer] = s.NamespaceDetailOut
    resumed_out: type[Serializer] = s.ResumedOut

    def fields(self, namespace: Namespace) -> dict[str, Any]:
        return namespace_fields(namespace)

    def drain(self, namespace: Namespace) -> dict[str, int]:
        return selectors.namespace_drain(namespace)


class NamespaceListCreateApi(_DescribesNamespaces, APIView):
    create_in: type[Serializer] = s.NamespaceCreateIn

    def get_permissions(self):
        return [IsOperator()] if self.request.method == "POST" else [AnyRole()]

    def create(self, principal: Principal, data: dict[str, Any]) -> Namespace:
        return services.namespace_create(principal=principal, name=data["name"])

    def namespaces(self) -> QuerySet[Namespace]:
        return selectors.namespace_list()

    @operation(
        "namespace_create",
        {201: s.NamespaceOut},
        (400, 401, 403, 409),
        request=s.NamespaceCreateIn,
        description="Epoch 1. Served by the core alone (no rollout app) a namespace is V1_ONLY, claim.v1; with the "
        "rollout app, stage V1_ONLY unless given. An existing name: 409 NAMESPACE_EXISTS.",
    )
    def post(self, request: AuthedRequest) -> Response:
        namespace = self.create(request.user, parsed(self.create_in, request))
        return Response(self.out(self.fields(namespace)).data, status=201)

    @operation("namespace_list", s.NamespacePage, (401,))
    def get(self, request: AuthedRequest) -> Response:
        return paginated(self, request, self.namespaces(), lambda ns: self.out(self.fields(ns)).data)


class NamespaceDetailApi(_DescribesNamespaces, APIView):
    permission_classes = [AnyRole]

    @operation("namespace_get", s.NamespaceDetailOut, (401, 404))
    def get(self, request: AuthedRequest, ns: str) -> Response:
        namespace = selectors.namespace_get(name=ns)
        return Response(self.detail_out({**self.fields(namespace), "drain": self.drain(namespace)}).data)


class NamespaceResumeApi(_DescribesNamespaces, APIView):
    permission_classes = [IsOncall]

    @operation(
        "namespace_resume",
        s.ResumedOut,
        request=s.OptionalReasonIn,
        description="Lift the pause; the epoch stays. Answers `{outcome: RESUMED, ...namespace}`. The reason is "
        "optional at every door — the console's form too (the frozen contract sends none); given, it is trimmed and "
        "audited with the principal. While the pause is held — a "
        "rollback draining holds it until it ends — 409 PAUSE_HELD (reason ROLLBACK), whoever asks.",
    )
    def post(self, request: AuthedRequest, ns: str) -> Response:
        data = parsed(s.OptionalReasonIn, request) if request.data else {}
        namespace = services.namespace_resume(principal=request.user, namespace=ns, **data)
        return Response(self.resumed_out({"outcome": "RESUMED", **self.fields(namespace)}).data)
