"""The routed operations as a table: each claim.v1 worker endpoint is one typed row (``Route``) — its input
dataclass (``inputs.py``), the task operation it is to every task it decides (``operations.py``: the legacy ask,
the write-through, the mirror, the accepted words), the core service that decides it, which tasks its answer
decided, and the shape of that answer. Views pass a row to ``routing.route``; the routing reads the row and holds
no endpoint's name.

Shapes: ``ONE`` — the task the request names; ``NEXT`` — the task claim-next picked (or none); ``BATCH`` — a list
of grants, all decided where claim.v1 decides, and in a stage where legacy decides claimed one by one at its first
refusal (``all_or_none``); ``ITEMS`` — a batch commit's answers by item index.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from claims import services as core
from claims.models import Principal

from .inputs import (
    ClaimBatchInput,
    ClaimInput,
    ClaimNextInput,
    CommitInput,
    CommitsInput,
    Input,
    ReleaseInput,
    RenewInput,
)
from .operations import CLAIM, COMMIT, RELEASE, RENEW, TaskOperation

In = TypeVar("In", bound=Input)
Decided = tuple[str, Input, Any]  # a task, its request's input, and the core's answer on it


class Shape(enum.Enum):
    ONE = "the task named"
    NEXT = "the task picked, or none"
    BATCH = "a list of grants"
    ITEMS = "answers by item index"


@dataclass(frozen=True)
class Route(Generic[In]):
    """One claim.v1 worker endpoint. ``core`` decides it (called with the principal, the task named — None for
    claim-next and batches — and the typed input); ``decided`` lists the tasks in the core's answer with each
    one's input and value."""

    name: str
    input: type[In]
    each: TaskOperation
    core: Callable[[Principal, Any, In], Any]
    decided: Callable[[str | None, In, Any], list[Decided]]
    shape: Shape = Shape.ONE
    all_or_none: bool = (
        False  # where legacy refuses one of its tasks, the decision is undone and made one by one
    )


def _named(task_id: str | None, data: Input, value: Any) -> list[Decided]:
    assert task_id is not None
    return [(task_id, data, value)]


def _grants(task_id: str | None, data: Input, grants: Any) -> list[Decided]:
    """The grants a claim (claim-next: of one task) settled."""
    return [(grant.task.task_id, data, grant) for grant in grants]


def _items(task_id: str | None, data: CommitsInput, answers: Any) -> list[Decided]:
    """A batch commit's items on the namespace settled: accepted ones with the core's answer, refused ones with
    the refusal (legacy may still decide those)."""
    items = data.items
    return [(items[index][0], items[index][1], answer) for index, answer in sorted(answers.items())]


def _on_one_task(name: str, input: type[In], each: TaskOperation, service: Callable[..., Any]) -> Route[In]:
    """An endpoint on the task its URL names: the core's service called with it."""
    return Route(name, input, each, lambda p, t, d: service(principal=p, task_id=t, **d.kwargs()), _named)


CLAIM_ROUTE = _on_one_task("claim", ClaimInput, CLAIM, core.task_claim)
RENEW_ROUTE = _on_one_task("renew", RenewInput, RENEW, core.task_renew)
RELEASE_ROUTE = _on_one_task("release", ReleaseInput, RELEASE, core.task_release)
COMMIT_ROUTE = _on_one_task("commit", CommitInput, COMMIT, core.task_commit)
CLAIM_NEXT_ROUTE = Route(
    "claim_next", ClaimNextInput, CLAIM,
    lambda p, t, d: core.task_claim_next(principal=p, **d.kwargs()), _grants, shape=Shape.NEXT,
)  # fmt: skip
CLAIM_BATCH_ROUTE = Route(
    "claim_batch", ClaimBatchInput, CLAIM,
    lambda p, t, d: core.task_claim_batch(principal=p, **d.kwargs()), _grants, shape=Shape.BATCH, all_or_none=True,
)  # fmt: skip
COMMITS_ROUTE = Route(
    "commits", CommitsInput, COMMIT,
    lambda p, t, d: core.task_commit_many(principal=p, **d.kwargs()), _items, shape=Shape.ITEMS,
)  # fmt: skip

ROUTES = (
    CLAIM_ROUTE, RENEW_ROUTE, RELEASE_ROUTE, COMMIT_ROUTE, CLAIM_NEXT_ROUTE, CLAIM_BATCH_ROUTE, COMMITS_ROUTE
)  # fmt: skip
