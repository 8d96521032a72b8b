"""The namespace endpoints with the rollout's record of each namespace: stage and protocol minimum. The core's
views, told how to create and describe a namespace (and documented through drf-spectacular's public decorators);
with the rollout app installed these are the only routes for their paths, the core's own serve them without it."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework.serializers import Serializer

from claims import apis as core_apis
from claims import namespace_apis as core_namespace_apis
from claims import serializers as core_s
from claims.apis import error_responses
from claims.models import Namespace, Principal

from . import selectors
from . import serializers as s
from .services import state


class _WithRolloutState:
    out: type[Serializer] = s.NamespaceOut
    detail_out: type[Serializer] = s.NamespaceDetailOut
    resumed_out: type[Serializer] = s.ResumedOut

    def fields(self, namespace: Namespace) -> dict[str, Any]:
        stage, min_protocol = selectors.rollout_state(namespace)
        return {**core_apis.namespace_fields(namespace), "stage": stage, "min_protocol": min_protocol}

    def drain(self, namespace: Namespace) -> dict[str, int]:
        # The rollout's drain counts (claim.v1's live leases and the legacy API's): the figures the drain API, the
        # console and the V1_WRITES → V1_ONLY gate use.
        return selectors.drain_counts(namespace)


@extend_schema_view(
    post=extend_schema(
        request=s.NamespaceCreateIn,
        responses={201: s.NamespaceOut, **error_responses(400, 401, 403, 409)},
        description="Epoch 1, stage V1_ONLY unless given (a namespace being migrated from the legacy table is "
        "created at LEGACY). An existing name: 409 NAMESPACE_EXISTS.",
    ),
    get=extend_schema(responses={200: s.NamespacePage, **error_responses(401)}),
)
class NamespaceListCreateApi(_WithRolloutState, core_namespace_apis.NamespaceListCreateApi):
    create_in: type[Serializer] = s.NamespaceCreateIn

    def create(self, principal: Principal, data: dict[str, Any]) -> Namespace:
        return state.namespace_create(principal=principal, **data)

    def namespaces(self) -> QuerySet[Namespace]:
        return super().namespaces().select_related("rollout")


@extend_schema_view(get=extend_schema(responses={200: s.NamespaceDetailOut, **error_responses(401, 404)}))
class NamespaceDetailApi(_WithRolloutState, core_namespace_apis.NamespaceDetailApi):
    pass


@extend_schema_view(
    post=extend_schema(
        request=core_s.OptionalReasonIn,
        responses={200: s.ResumedOut, **error_responses(400, 401, 403, 404, 409)},
    )
)
class NamespaceResumeApi(_WithRolloutState, core_namespace_apis.NamespaceResumeApi):
    pass
