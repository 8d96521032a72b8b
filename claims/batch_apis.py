"""claim-v1.md §9's batch endpoints as the core alone serves them: claim up to 100 at once, commit up to 100 at once
(a wrapping app subclasses them: rollout/worker_apis.py)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from . import serializers as s
from . import services
from .apis import (
    CLAIM_KEY,
    AuthedRequest,
    built,
    claim_body,
    claim_or_wait,
    commit_body,
    operation,
    parsed,
    release_grant,
)
from .errors import ClaimError, exception_handler
from .models import Principal
from .permissions import IsWorker


def refusal(exc: Exception) -> tuple[int, dict[str, Any]]:
    """A refused item's status and body, exactly as the single request's answer (the one exception handler)."""
    response = exception_handler(exc, {})
    if response is None:
        raise exc
    return response.status_code, dict(response.data)


class ClaimBatchApi(APIView):
    permission_classes = [IsWorker]

    def claims(self, principal: Principal, data: dict[str, Any]) -> list[dict[str, Any]]:
        return [claim_body(g) for g in services.task_claim_batch(principal=principal, **data)]

    def claim(self, principal: Principal, data: dict[str, Any]) -> dict[str, Any] | None:
        claims = self.claims(principal, data)
        return {"outcome": "CLAIMED", "claims": claims} if claims else None  # each already its answer's body

    def release(self, principal: Principal, owner_id: str, grant: dict[str, Any]) -> None:
        release_grant(principal, owner_id, grant)

    @operation(
        "claim_batch",
        {
            200: s.ClaimBatchOut,
            204: OpenApiResponse(description="Nothing is claimable (after `wait_seconds`, if given)."),
        },
        (400, 401, 403, 409),
        request=s.ClaimBatchIn,
        parameters=[CLAIM_KEY],
        description="claim-v1.md §9: claim up to `max_tasks` (1–100) tasks at once, each exactly as claim-next "
        "claims one (its own attempt, generation and fences). Concurrent callers never receive the same task; a "
        "task whose resources are held is passed over. 409 FENCED (EPOCH) or CLAIMS_PAUSED.",
    )
    def post(self, request: AuthedRequest) -> Response:
        return claim_or_wait(self, request, s.ClaimBatchIn)


class CommitsApi(APIView):
    permission_classes = [IsWorker]

    def commit(self, principal: Principal, task_id: str, data: dict[str, Any]) -> dict[str, Any]:
        return commit_body(services.task_commit(principal=principal, task_id=task_id, **data))

    def together(
        self, principal: Principal, items: list[tuple[str, dict[str, Any]]]
    ) -> dict[int, services.Committed | ClaimError]:
        """The items decided together, by index; those left out are sent one by one (``commit``)."""
        return services.task_commit_many(principal=principal, items=items)

    def answers(self, principal: Principal, items: list[Any]) -> list[dict[str, Any]]:
        """Each item's status and body as its single commit would answer, in the order given."""
        results: list[dict[str, Any] | None] = [None] * len(items)
        valid: list[tuple[int, str, dict[str, Any]]] = []
        for index, item in enumerate(items):
            try:
                data = dict(built(s.CommitItemIn).run_validation(item))
            except ValidationError as exc:
                results[index] = self.refused(item.get("task_id") if isinstance(item, dict) else None, exc)
                continue
            valid.append((index, data.pop("task_id"), data))
        decided = self.together(principal, [(task_id, data) for _, task_id, data in valid]) if valid else {}
        for position, (index, task_id, data) in enumerate(valid):
            answer: Any = decided.get(position)
            if answer is None:
                try:
                    answer = self.commit(principal, task_id, data)
                except (ClaimError, ValidationError) as exc:
                    answer = exc
            if isinstance(answer, (ClaimError, ValidationError)):
                results[index] = self.refused(task_id, answer)
            else:
                body = commit_body(answer) if isinstance(answer, services.Committed) else answer
                results[index] = {"task_id": task_id, "status": 200, "body": body}
        return [result for result in results if result is not None]

    def refused(self, task_id: Any, exc: Exception) -> dict[str, Any]:
        status, body = refusal(exc)
        return {"task_id": task_id if isinstance(task_id, str) else "", "status": status, "body": body}

    @operation(
        "commits",
        s.CommitsOut,
        (400, 401, 403),
        request=s.CommitsIn,
        description="claim-v1.md §9: 1 to 100 commits (each a commit body with its `task_id`, inline `result` "
        "allowed), answered in the order given with the status and body that single commit would have answered "
        "(200, 400, 403, 404 or 409). Each item is judged on its own and a refused item changes nothing and undoes "
        "none of the others. The common items (no resources, no successors, each task named once) are decided in "
        "one transaction with every task row locked at once in task_id order; the others each in their own. A "
        "malformed envelope is a 400 for the whole request.",
    )
    def post(self, request: AuthedRequest) -> Response:
        items = parsed(s.CommitsIn, request)["commits"]
        return Response(s.CommitsOut({"results": self.answers(request.user, items)}).data)
