"""The claim.v1 worker operations and task reads, routed by the namespace's rollout stage. With the rollout app
installed these are the only routes for their paths (``controlplane/urls.py``); each parses the core's input
serializer, calls ``services.routing`` once and shapes the answer with the output serializer its schema names.
Refusals are typed errors, shaped by the one exception handler."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from drf_spectacular.utils import (
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_view,
)
from rest_framework.response import Response
from rest_framework.serializers import Serializer
from rest_framework.views import APIView

from claims import apis as core_apis
from claims import batch_apis as core_batch_apis
from claims import serializers as core_s
from claims.apis import AuthedRequest, error_responses, operation, paginated, parsed, rendered
from claims.permissions import AnyRole, IsTaskCreator, IsWorker
from claims.services import claim_keys

from . import selectors
from . import serializers as s
from .services import routing
from .services.inputs import CommitInput, CommitsInput, ReleaseInput
from .services.routes import (
    CLAIM_BATCH_ROUTE,
    CLAIM_NEXT_ROUTE,
    CLAIM_ROUTE,
    COMMIT_ROUTE,
    COMMITS_ROUTE,
    RELEASE_ROUTE,
    RENEW_ROUTE,
    Route,
)

_ROUTING = (
    " Routed by the namespace's rollout stage (docs/rollout.md): LEGACY → 409 STAGE_NOT_OPEN; SHADOW/V1_READS → "
    "legacy decides, claim.v1 judges in shadow (`decided_by: legacy`, `shadow`); V1_WRITES → claim.v1 decides and "
    "writes through to the legacy store; V1_ONLY → claim.v1 alone."
)


def _answer(name: str, core_out: type) -> Any:
    return PolymorphicProxySerializer(
        component_name=name, serializers=[core_out, s.LegacyDecidedOut], resource_type_field_name=None
    )


def _errors() -> dict[int, Any]:
    return {
        **error_responses(400, 401, 403, 404),
        409: OpenApiResponse(
            PolymorphicProxySerializer(
                component_name="RoutedConflict",
                serializers=[core_s.ConflictOut, s.LegacyRefusedOut],
                resource_type_field_name=None,
            ),
            description="The core's refusal, STAGE_NOT_OPEN / PROTOCOL_TOO_OLD, or legacy's word where it decides.",
        ),
    }


class _RoutedOperation(APIView):
    """One worker operation on a task: parse the core's input, route it once, answer with the core's own body
    where claim.v1 decided and with ``LegacyDecidedOut`` where legacy did."""

    permission_classes = [IsWorker]
    route: Route[Any]
    input: type[Serializer]
    core_body: Callable[[Any], dict[str, Any]]
    keyed = False  # a claim: its Idempotency-Key names the request (``claims.apis.claim_request``)

    def post(self, request: AuthedRequest, task_id: str) -> Response:
        data = parsed(self.input, request)
        with claim_keys.requested(core_apis.claim_request(request, data) if self.keyed else None):
            return Response(routed_answer(self.route, type(self).core_body, request.user, task_id, data))


def routed_answer(
    route: Route[Any],
    core_body: Callable[[Any], dict[str, Any]],
    principal: Any,
    task_id: str,
    data: dict[str, Any],
) -> dict[str, Any]:
    """One worker operation routed once (``route``: its row of the operation table), answered with the core's own
    body where claim.v1 decided and with ``LegacyDecidedOut`` where legacy did."""
    routed = routing.route(route, principal=principal, task_id=task_id, data=route.input.of(data))
    if routed.decided_by == routing.CLAIM_V1:
        return core_body(routed.value)
    return rendered(s.LegacyDecidedOut, routed.fields)


def _documented(operation_id: str, request: type, out: type, description: str, **schema: Any) -> Any:
    """The routed operation's schema through drf-spectacular's public decorators: the core's input, and the
    answer either as the core's output or as legacy decided it (``<Operation>Answer``)."""
    component = operation_id.removeprefix("task_").capitalize() + "Answer"
    return extend_schema_view(
        post=extend_schema(
            operation_id=operation_id,
            request=request,
            responses={200: _answer(component, out), **_errors()},
            description=description + _ROUTING,
            **schema,
        )
    )


@_documented(
    "task_claim",
    core_s.ClaimIn,
    core_s.ClaimOut,
    "Claim from READY, from CLAIMED with an expired lease, or from CLAIMED under an older epoch. 409 in order: "
    "FENCED (EPOCH), CLAIMS_PAUSED, VERSION_MISMATCH, NOT_CLAIMABLE (STATE | LEASE_LIVE | RESOURCE_HELD).",
    parameters=[core_apis.CLAIM_KEY],
)
class TaskClaimApi(_RoutedOperation):
    route, input, core_body = CLAIM_ROUTE, core_s.ClaimIn, staticmethod(core_apis.claim_body)
    keyed = True


@_documented(
    "task_renew",
    core_s.RenewIn,
    core_s.RenewOut,
    "New expiry = server-now + extend_seconds. 409 in order: CANCELLED, FENCED (EPOCH | GENERATION | ATTEMPT | "
    "OWNER), EXPIRED.",
)
class TaskRenewApi(_RoutedOperation):
    route, input, core_body = RENEW_ROUTE, core_s.RenewIn, staticmethod(core_apis.renew_body)


@_documented(
    "task_release",
    core_s.ReleaseIn,
    core_s.OutcomeOut,
    "Task back to READY; the attempt ends. 409 FENCED when the attempt is not current.",
)
class TaskReleaseApi(_RoutedOperation):
    route, input, core_body = (
        RELEASE_ROUTE,
        core_s.ReleaseIn,
        staticmethod(lambda task: core_apis.release_body()),
    )


@_documented(
    "task_commit",
    core_s.CommitIn,
    core_s.CommitOut,
    "A repeat of a successful commit returns the stored body first. Otherwise, in order: CANCELLED; FENCED (EPOCH "
    "| GENERATION | ATTEMPT | LEASE_EXPIRED); STALE_INPUT; STALE_INPUT (RESOURCE); NOT_STAGED. Where legacy "
    "decides, a commit is a legacy complete with this attempt's staged result; with none staged the core answers.",
)
class TaskCommitApi(_RoutedOperation):
    route, input, core_body = COMMIT_ROUTE, core_s.CommitIn, staticmethod(core_apis.commit_body)


class ClaimNextApi(core_apis.ClaimNextApi):
    def claim(self, principal: Any, data: dict[str, Any]) -> dict[str, Any] | None:
        routed = routing.route(CLAIM_NEXT_ROUTE, principal=principal, data=CLAIM_NEXT_ROUTE.input.of(data))
        return None if routed.value is None else _claim_answer(routed)

    def release(self, principal: Any, owner_id: str, grant: dict[str, Any]) -> None:
        _release_routed(principal, owner_id, grant)

    @extend_schema(
        operation_id="claim_next",
        request=core_s.ClaimNextIn,
        parameters=[core_apis.CLAIM_KEY],
        responses={
            200: _answer("ClaimNextAnswer", core_s.ClaimOut),
            204: OpenApiResponse(description="Nothing is claimable (no body)."),
            **_errors(),
        },
        description="Claim the oldest claimable task of the namespace (default `default`), optionally only of "
        "`node_ids`. Concurrent callers never receive the same task. 409 FENCED (EPOCH) or CLAIMS_PAUSED. "
        "claim.v1 picks in every open stage; where legacy decides it then decides the grant." + _ROUTING,
    )
    def post(self, request: AuthedRequest) -> Response:
        return core_apis.claim_or_wait(self, request, core_s.ClaimNextIn)


def _claim_answer(routed: routing.Routed) -> dict[str, Any]:
    if routed.decided_by == routing.CLAIM_V1:
        return core_apis.claim_body(routed.value)
    return rendered(s.LegacyDecidedOut, routed.fields)


@extend_schema_view(
    post=extend_schema(
        operation_id="claim_batch",
        request=core_s.ClaimBatchIn,
        parameters=[core_apis.CLAIM_KEY],
        responses={
            200: s.RoutedClaimBatchOut,
            204: OpenApiResponse(description="Nothing is claimable (after `wait_seconds`, if given)."),
            **_errors(),
        },
        description="claim-v1.md §9: claim up to `max_tasks` (1–100) tasks at once, each exactly as claim-next "
        "claims one. Concurrent callers never receive the same task; a task whose resources are held is passed "
        "over. 409 FENCED (EPOCH) or CLAIMS_PAUSED. In V1_ONLY one transaction; in the other open stages each "
        "claim is routed as claim-next routes it, and a claim legacy refuses is left out." + _ROUTING,
    )
)
class ClaimBatchApi(core_batch_apis.ClaimBatchApi):
    def claims(self, principal: Any, data: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            _claim_answer(routed)
            for routed in routing.route(
                CLAIM_BATCH_ROUTE, principal=principal, data=CLAIM_BATCH_ROUTE.input.of(data)
            )
        ]

    def release(self, principal: Any, owner_id: str, grant: dict[str, Any]) -> None:
        _release_routed(principal, owner_id, grant)


def _release_routed(principal: Any, owner_id: str, grant: dict[str, Any]) -> None:
    """A claim answered to a client that has gone, given back as the stage routes a release."""
    data = ReleaseInput(
        attempt_id=uuid.UUID(str(grant["attempt_id"])),
        claim_generation=grant["claim_generation"],
        owner_id=owner_id,
        scheduler_epoch=grant["scheduler_epoch"],
    )
    routing.route(RELEASE_ROUTE, principal=principal, task_id=grant["task_id"], data=data)


class CommitsApi(core_batch_apis.CommitsApi):
    """The common items decided together by the core in every open stage, each settled as its stage says (where
    legacy decides, legacy completes each in the same transaction); every other item routed as the single commit
    is (``TaskCommitApi``)."""

    def together(self, principal: Any, items: list[tuple[str, dict[str, Any]]]) -> dict[int, Any]:
        data = CommitsInput([(task_id, CommitInput.of(item)) for task_id, item in items])
        answers = routing.route(COMMITS_ROUTE, principal=principal, data=data)
        return {
            index: rendered(s.LegacyDecidedOut, answer) if isinstance(answer, dict) else answer
            for index, answer in answers.items()
        }

    def commit(self, principal: Any, task_id: str, data: dict[str, Any]) -> dict[str, Any]:
        return routed_answer(COMMIT_ROUTE, core_apis.commit_body, principal, task_id, data)


class TaskDetailApi(APIView):
    permission_classes = [AnyRole]

    @operation(
        "task_get",
        s.ReadFromOut,
        (401, 404),
        description="In LEGACY and SHADOW the holder, expiry and result are the legacy store's (`read_from`).",
    )
    def get(self, request: AuthedRequest, task_id: str) -> Response:
        task = selectors.legacy_view(selectors.task_get(task_id=task_id))
        return Response(s.ReadFromOut(task).data)


class TaskListCreateApi(core_apis.TaskListCreateApi):
    """The core's create; the list as readers see it by stage."""

    def get_permissions(self):
        return [IsTaskCreator()] if self.request.method == "POST" else [AnyRole()]

    @operation(
        "task_list",
        s.ReadTaskPage,
        (400, 401),
        parameters=[core_s.TaskListQuery],
        description="Tasks, oldest first. The frontier is `state=READY`; in LEGACY and SHADOW the state is the "
        "legacy store's.",
    )
    def get(self, request: AuthedRequest) -> Response:
        query = core_s.TaskListQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        tasks = selectors.task_list(
            namespace=query.validated_data.get("namespace"), state=query.validated_data.get("state")
        )
        return paginated(self, request, tasks, lambda t: s.ReadFromOut(selectors.legacy_view(t)).data)
