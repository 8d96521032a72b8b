"""The claim.v1 REST API: one thin view per operation — parse, call one service, shape the answer.

Answers are decided in the contract's order: 401 (authentication) → 403 (role: permission classes) → 400 (the
input serializer) → 404 → 403 (not your attempt) → 409 (the service, in each endpoint's order).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework.exceptions import NotAuthenticated, PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import Serializer
from rest_framework.views import APIView

from . import selectors, services
from . import serializers as s
from .digest import digest
from .errors import Invalid
from .models import Namespace, Principal, Task
from .pagination import Pagination
from .permissions import AnyRole, IsOperator, IsTaskCreator, IsWorker
from .waiting import ClaimWait, may_wait

if TYPE_CHECKING:

    class AuthedRequest(Request):
        """A request past ``claims.auth``: its user is the token's Principal (for the type checker only)."""

        # DRF types request.user as Django's user; past claims.auth it is our Principal (a typing view only).
        @property  # type: ignore[misc]
        def user(self) -> Principal:  # type: ignore[override]
            ...

else:
    AuthedRequest = Request

_Call = TypeVar("_Call", bound="ServiceCall")


def error_responses(*codes: int) -> dict[int, Any]:
    table = {
        400: OpenApiResponse(s.InvalidOut, description="Malformed input; nothing changed."),
        401: OpenApiResponse(s.ErrorOut, description="No or unknown bearer token."),
        403: OpenApiResponse(s.ErrorOut, description="Role not allowed, or not your attempt / owner_id."),
        404: OpenApiResponse(s.ErrorOut, description="Unknown task or namespace."),
        409: OpenApiResponse(
            s.ConflictOut, description="Protocol rejection: `{outcome, reason, detail, current}`."
        ),
    }
    return {code: table[code] for code in codes}


REFUSALS = (400, 401, 403, 404, 409)  # what a write on a named task or namespace can be refused with


def operation(operation_id: str, answers: Any, errors: tuple[int, ...] = REFUSALS, **more: Any) -> Any:
    """One view method in the OpenAPI schema (``extend_schema``): its answers (a serializer alone is the 200), then
    the refusals it can meet, by code (``error_responses``)."""
    ok = answers if isinstance(answers, dict) else {200: answers}
    return extend_schema(operation_id=operation_id, responses={**ok, **error_responses(*errors)}, **more)


CLAIM_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    required=False,
    description="Optional, 1–200 printable ASCII characters, new for each claim request. Sent again with the same "
    "request (after a dropped connection or a failover), it answers what that request was granted instead of "
    "granting anew: its worker never holds a task it was not told of. The same key with another request: 400. "
    "Kept CLAIM_KEY_RETENTION_SECONDS (default a day) per principal; where legacy decides (SHADOW, V1_READS) it is "
    'not used (docs/workers.md, "Retrying a claim").',
)


def documented(
    operation_id: str,
    answer: Any,
    description: str | None = None,
    *,
    errors: tuple[int, ...] = REFUSALS,
    **schema: Any,
) -> Callable[[type[_Call]], type[_Call]]:
    """A ``ServiceCall``'s POST in the schema: its ``input`` as the request, ``answer`` under its ``status``."""

    def document(view: type[_Call]) -> type[_Call]:
        more = {} if description is None else {"description": description}
        answers = answer if isinstance(answer, dict) else {view.status: answer}
        post = operation(operation_id, answers, errors, request=view.input, **more, **schema)
        return extend_schema_view(post=post)(view)

    return document


def task_body(task: Task) -> dict[str, Any]:
    return s.TaskOut(task).data


def namespace_fields(namespace: Namespace) -> dict[str, Any]:
    """The namespace as the core alone serves it: claim.v1 only (``serializers.CORE_STAGE``)."""
    return {
        "name": namespace.name,
        "scheduler_epoch": namespace.scheduler_epoch,
        "claims_paused": namespace.claims_paused,
        "stage": s.CORE_STAGE,
        "min_protocol": s.CORE_PROTOCOL,
    }


def claim_body(grant: services.ClaimGrant) -> dict[str, Any]:
    return rendered(s.ClaimOut, grant.fields())


def renew_body(task: Task) -> dict[str, Any]:
    return rendered(s.RenewOut, {"outcome": "RENEWED", "lease_expires_at": task.lease_expires_at})


def release_body() -> dict[str, Any]:
    return rendered(s.OutcomeOut, {"outcome": "RELEASED"})


def commit_body(committed: services.Committed) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "outcome": "COMMITTED",
        "result_commit_id": committed.result_commit_id,
        "unblocked": committed.unblocked,
    }
    if committed.staged_result_id is not None:
        fields["staged_result_id"] = committed.staged_result_id
    return rendered(s.CommitOut, fields)


def paginated(view: APIView, request: Request, queryset: Any, render: Any) -> Response:
    paginator = Pagination()
    page = paginator.paginate_queryset(queryset, request, view=view)
    return paginator.get_paginated_response([render(item) for item in page or []])


_built = threading.local()


def built(serializer_class: type[Serializer]) -> Serializer:
    """This thread's one instance of ``serializer_class``, its fields built once. DRF deep-copies a serializer's
    declared fields each time one is made (a third of a worker request's own time in bench/profile_http.py), while
    ``run_validation`` and ``to_representation`` keep nothing on the instance — so the worker path validates and
    renders with one instance per class per thread, with no context."""
    cache = getattr(_built, "instances", None)
    if cache is None:
        cache = _built.instances = {}
    instance = cache.get(serializer_class)
    if instance is None:
        instance = cache[serializer_class] = serializer_class()
    return instance


def parsed(serializer_class: type[Serializer], request: Request) -> dict[str, Any]:
    """The request's body validated by ``serializer_class`` (its ValidationError is the 400 with field errors)."""
    return dict(built(serializer_class).run_validation(request.data))


def claim_request(request: Request, data: dict[str, Any]) -> services.claim_keys.Requested | None:
    """A claim request's ``Idempotency-Key`` header with the digest of what it asks (its path and parsed body), or
    None without one (docs/workers.md, "Retrying a claim")."""
    header = services.claim_keys.HEADER
    key = request.headers.get(header)
    if key is None:
        return None
    if not 1 <= len(key) <= 200 or not (key.isascii() and key.isprintable()):
        raise Invalid({header: ["must be 1 to 200 printable ASCII characters"]})
    return services.claim_keys.Requested(key, digest({"path": request.path, "request": data}))


def rendered(serializer_class: type[Serializer], value: Any) -> dict[str, Any]:
    return built(serializer_class).to_representation(value)


# One call of one service: its input parsed (``input``; None: no body), the service called with the principal, what
# the URL names (the task, the effect) and the input, and its value answered through ``body`` with ``status`` (200
# unless said). Comments, not a docstring: drf-spectacular would show a base class's docstring as the description of
# every endpoint built on it that gives none.
class ServiceCall(APIView):
    input: type[Serializer] | None
    service: Callable[..., Any]
    body: Callable[[Any], dict[str, Any]]
    status = 200
    # a URL name the service calls otherwise (the rollout's ``ns`` is its services' ``namespace``)
    as_named: dict[str, str] = {}
    keyed = False  # a claim: its Idempotency-Key names the request (``claim_request``)

    def post(self, request: AuthedRequest, **named: str) -> Response:
        data = parsed(self.input, request) if self.input is not None else {}
        called = {self.as_named.get(name, name): value for name, value in named.items()}
        with services.claim_keys.requested(claim_request(request, data) if self.keyed else None):
            value = type(self).service(principal=request.user, **called, **data)
        return Response(self.answer(value, **named), status=self.status_of(value))

    def answer(self, value: Any, **named: str) -> dict[str, Any]:
        return type(self).body(value)

    def status_of(self, value: Any) -> int:
        return self.status


# --- tasks --------------------------------------------------------------------------------------------


@documented(
    "task_create",
    {201: s.TaskOut, 200: OpenApiResponse(s.TaskOut, description="Idempotent repeat.")},
    "Create a task: READY, or BLOCKED while any `depends_on` task is not COMMITTED. Re-creating an existing task_id "
    "with the same definition returns it (200); anything else is 409 TASK_EXISTS. An unknown namespace, depends_on "
    "task or resource in the body is a 400.",
    errors=(400, 401, 403, 409),
)
class TaskListCreateApi(ServiceCall):
    input, service = s.TaskCreateIn, staticmethod(services.task_create)
    body = staticmethod(lambda created: task_body(selectors.task_get(task_id=created.task.task_id)))

    def get_permissions(self):
        return [IsTaskCreator()] if self.request.method == "POST" else [AnyRole()]

    def status_of(self, created: Any) -> int:
        return 201 if created.created else 200

    @operation(
        "task_list",
        s.TaskPage,
        (400, 401),
        parameters=[s.TaskListQuery],
        description="Tasks, oldest first. The frontier is `state=READY`.",
    )
    def get(self, request: AuthedRequest) -> Response:
        query = s.TaskListQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        return paginated(self, request, selectors.task_list(**query.validated_data), task_body)


class TaskDetailApi(APIView):
    permission_classes = [AnyRole]

    @operation("task_get", s.TaskOut, (401, 404))
    def get(self, request: AuthedRequest, task_id: str) -> Response:
        return Response(task_body(selectors.task_get(task_id=task_id)))


class TaskEventsApi(APIView):
    permission_classes = [AnyRole]

    @operation(
        "task_events",
        s.EventPage,
        (401, 404),
        description="The task's timeline, oldest first. Never secrets or payloads.",
    )
    def get(self, request: AuthedRequest, task_id: str) -> Response:
        return paginated(self, request, selectors.task_events(task_id=task_id), lambda e: s.EventOut(e).data)


# An operator's action on a task: answered with the task as it now is, read again.
class _OperatorTaskAction(ServiceCall):
    permission_classes = [IsOperator]

    def answer(self, value: Any, **named: str) -> dict[str, Any]:
        return task_body(selectors.task_get(task_id=named["task_id"]))


def _staged_body(staged: Any) -> dict[str, Any]:
    return s.StageOut({"outcome": "STAGED", "staged_result_id": staged.staged.pk}).data


@documented(
    "task_revise_input",
    s.TaskOut,
    "Revise the input: new input_digest, state_version+1. A claim in flight stays, but its commit "
    "with the old digest gets STALE_INPUT. COMMITTED or CANCELLED: 409 NOT_REVISABLE. The same input again "
    "changes nothing.",
)
class TaskInputApi(_OperatorTaskAction):
    input, service = s.TaskInputIn, staticmethod(services.task_revise_input)


@documented(
    "task_cancel",
    s.TaskOut,
    "cancel_generation+1, state CANCELLED, the current attempt ends. COMMITTED: 409 "
    "NOT_CANCELLABLE. Cancelling a CANCELLED task changes nothing.",
)
class TaskCancelApi(_OperatorTaskAction):
    input, service = s.ReasonIn, staticmethod(services.task_cancel)


@documented(
    "task_requeue",
    s.TaskOut,
    "A CANCELLED task back to READY (BLOCKED while predecessors are uncommitted); "
    "cancel_generation stays. Any other state: 409 INVALID_TRANSITION.",
    errors=(401, 403, 404, 409),
)
class TaskRequeueApi(_OperatorTaskAction):
    input, service = None, staticmethod(services.task_requeue)


@documented(
    "task_set_priority",
    s.TaskOut,
    "claim-v1.md §10 (operator): the task's priority for its next grant — a holder is never interrupted. The task "
    "takes a new place at the new priority, as if it joined it now; recorded in its timeline and the audit log with "
    "the principal and `reason`. COMMITTED or CANCELLED: 409 NOT_CLAIMABLE (STATE). The same priority again changes "
    "nothing.",
)
class TaskPriorityApi(_OperatorTaskAction):
    input, service = s.PriorityIn, staticmethod(services.task_set_priority)


# --- claims -------------------------------------------------------------------------------------------


@documented(
    "task_claim",
    s.ClaimOut,
    "Claim from READY, from CLAIMED with an expired lease, or from CLAIMED under an older epoch. "
    "409 in order: FENCED (EPOCH), CLAIMS_PAUSED, VERSION_MISMATCH, NOT_CLAIMABLE (STATE | LEASE_LIVE | "
    "RESOURCE_HELD). Of N concurrent claims exactly one gets 200.",
    parameters=[CLAIM_KEY],
)
class TaskClaimApi(ServiceCall):
    permission_classes = [IsWorker]
    input, service, body = s.ClaimIn, staticmethod(services.task_claim), staticmethod(claim_body)
    keyed = True


class ClaimNextApi(APIView):
    permission_classes = [IsWorker]

    def claim(self, principal: Principal, data: dict[str, Any]) -> dict[str, Any] | None:
        grant = services.task_claim_next(principal=principal, **data)
        return None if grant is None else claim_body(grant)

    def release(self, principal: Principal, owner_id: str, grant: dict[str, Any]) -> None:
        release_grant(principal, owner_id, grant)

    @operation(
        "claim_next",
        {
            200: s.ClaimOut,
            204: OpenApiResponse(
                description="Nothing is claimable (after `wait_seconds`, if given; no body)."
            ),
        },
        (400, 401, 403, 409),
        request=s.ClaimNextIn,
        parameters=[CLAIM_KEY],
        description="Claim the oldest claimable task of the namespace (default `default`), optionally only of "
        "`node_ids`. Concurrent callers never receive the same task. 409 FENCED (EPOCH) or CLAIMS_PAUSED. With "
        "`wait_seconds`, waits for a task to become claimable (claim-v1.md §9).",
    )
    def post(self, request: AuthedRequest) -> Response:
        return claim_or_wait(self, request, s.ClaimNextIn)


def claim_or_wait(view: Any, request: AuthedRequest, serializer: type[Serializer]) -> Response:
    """A claim view's answer: the claim's body, or 204 — one that may wait when ``wait_seconds`` says so
    (``claims.waiting``: the async view around this one retries ``view.claim`` when woken, as the request's token
    authenticates again, and gives back with ``view.release`` what it granted to a client that has gone)."""
    data, wait = without_wait(parsed(serializer, request))
    key = claim_request(request, data)
    with services.claim_keys.requested(key):
        body = view.claim(request.user, data)
    if body is not None:
        return Response(body)

    def retry() -> dict[str, Any] | None:
        with services.claim_keys.requested(key):
            return view.claim(reauthenticated(request, view), data)

    def release(answer: dict[str, Any]) -> None:
        for grant in answer.get("claims", [answer]):
            view.release(request.user, data["owner_id"], grant)

    nodes = data.get("node_ids")
    return may_wait(
        Response(status=204),
        ClaimWait(
            namespace=data.get("namespace", "default"),
            seconds=wait,
            retry=retry,
            release=release,
            nodes=frozenset(nodes) if nodes else None,
        ),
    )


def reauthenticated(request: Request, view: APIView) -> Principal:
    """The request's principal as its token authenticates now, with the view's permissions checked again: a
    waiting claim's every retry is a fresh request as far as authority goes. Raises 401/403 as DRF would."""
    principal: Principal | None = None
    for authenticator in request.authenticators or ():
        found = authenticator.authenticate(request)
        if found is not None and isinstance(found[0], Principal):
            principal = found[0]
            break
    if principal is None:
        raise NotAuthenticated("a token is required")
    request.user = principal  # type: ignore[assignment]  # the permissions below read it
    for permission in view.get_permissions():
        if not permission.has_permission(request, view):
            raise PermissionDenied(getattr(permission, "message", None))
    return principal


def release_grant(principal: Principal, owner_id: str, grant: dict[str, Any]) -> None:
    """Give back one claim answered to a client that has gone (``claims.waiting``)."""
    services.task_release(
        principal=principal,
        task_id=grant["task_id"],
        attempt_id=uuid.UUID(str(grant["attempt_id"])),
        claim_generation=grant["claim_generation"],
        owner_id=owner_id,
        scheduler_epoch=grant["scheduler_epoch"],
    )


@documented(
    "task_renew",
    s.RenewOut,
    "New expiry = server-now + extend_seconds (bounded by LEASE_MIN_SECONDS..LEASE_MAX_SECONDS). "
    "409 in order: CANCELLED, FENCED (EPOCH | GENERATION | ATTEMPT | OWNER), EXPIRED.",
)
class TaskRenewApi(ServiceCall):
    permission_classes = [IsWorker]
    input, service, body = s.RenewIn, staticmethod(services.task_renew), staticmethod(renew_body)


@documented(
    "task_release",
    s.OutcomeOut,
    "Task back to READY; the attempt ends. 409 FENCED when the attempt is not current.",
)
class TaskReleaseApi(ServiceCall):
    permission_classes = [IsWorker]
    input, service, body = (
        s.ReleaseIn,
        staticmethod(services.task_release),
        staticmethod(lambda task: release_body()),
    )


@documented(
    "result_stage",
    s.StageOut,
    "Stage a result, isolated. Any attempt of the task may stage, whatever the task's state. "
    "`result_digest` must be the digest of `result` (400). The same digest again returns the same record.",
)
class TaskResultsApi(ServiceCall):
    permission_classes = [IsWorker]
    input, service, body = s.StageIn, staticmethod(services.result_stage), staticmethod(_staged_body)
    status = 201


@documented(
    "task_commit",
    s.CommitOut,
    "A repeat of a successful commit returns the stored body first. Otherwise, in order: "
    "CANCELLED; FENCED (EPOCH | GENERATION | ATTEMPT | LEASE_EXPIRED); STALE_INPUT; STALE_INPUT (RESOURCE); "
    "NOT_STAGED. `resources` must name exactly the task's resources (400).",
)
class TaskCommitApi(ServiceCall):
    permission_classes = [IsWorker]
    input, service, body = s.CommitIn, staticmethod(services.task_commit), staticmethod(commit_body)


def without_wait(data: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The claim's input for the service, and how long the request may wait (the view's business, not the
    service's)."""
    data = dict(data)
    return data, data.pop("wait_seconds", 0)
