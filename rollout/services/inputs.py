"""The typed input of each routed claim.v1 endpoint: the fields its serializer validated (claims/serializers.py),
as a frozen dataclass the routing reads by name — never a ``dict[str, Any]``. ``of`` takes the validated data
(what the endpoint does not route, such as claim-next's ``wait_seconds``, stays with the view); ``kwargs`` is the
core service's keyword arguments.

The routing asks every input the same three questions (``named_owner``, ``lease_seconds``, ``digest_of_result``):
what legacy is asked is made from those, whatever the endpoint.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Self

NO_RESULT: Any = object()  # a commit without an inline result: it commits the one staged earlier


@dataclass(frozen=True)
class Input:
    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Self:
        names = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in names})

    def kwargs(self) -> dict[str, Any]:
        """The core service's keyword arguments (a commit's absent result left out: it commits a staged one)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return {key: value for key, value in out.items() if value is not NO_RESULT}

    def named_owner(self) -> str | None:
        """The owner the request names (a commit names none: its attempt is the owner's)."""
        return None

    def lease_seconds(self) -> int:
        """The lease legacy is asked for."""
        return 30

    def digest_of_result(self) -> str:
        return ""


@dataclass(frozen=True)
class _Claiming(Input):
    """What every claim names: the owner, the epoch it carries, the lease it asks for."""

    owner_id: str
    scheduler_epoch: int
    ttl_seconds: int

    def named_owner(self) -> str | None:
        return self.owner_id

    def lease_seconds(self) -> int:
        return self.ttl_seconds


@dataclass(frozen=True)
class ClaimInput(_Claiming):
    expected_state_version: int | None = None


@dataclass(frozen=True)
class ClaimNextInput(_Claiming):
    namespace: str = "default"
    node_ids: list[str] | None = None
    passed_over: list[str] | None = None


@dataclass(frozen=True)
class ClaimBatchInput(ClaimNextInput):
    max_tasks: int = 1

    def one_at_a_time(self, passed_over: list[str]) -> ClaimNextInput:
        """This batch's claim-next, passing over the tasks named."""
        one = {f.name: getattr(self, f.name) for f in fields(ClaimNextInput)}
        return ClaimNextInput(**{**one, "passed_over": passed_over})


@dataclass(frozen=True)
class _OnAnAttempt(Input):
    """What every call on a granted attempt names: the attempt, its generation, the owner, the epoch carried."""

    attempt_id: uuid.UUID
    claim_generation: int
    owner_id: str
    scheduler_epoch: int

    def named_owner(self) -> str | None:
        return self.owner_id


@dataclass(frozen=True)
class RenewInput(_OnAnAttempt):
    cancel_generation: int
    extend_seconds: int

    def lease_seconds(self) -> int:
        return self.extend_seconds


@dataclass(frozen=True)
class ReleaseInput(_OnAnAttempt):
    pass


@dataclass(frozen=True)
class CommitInput(Input):
    attempt_id: uuid.UUID
    scheduler_epoch: int
    claim_generation: int
    observed_cancel_generation: int
    input_digest: str
    result_digest: str
    resources: list[dict[str, Any]] = field(default_factory=list)
    result: Any = NO_RESULT

    @property
    def inline(self) -> bool:
        """The result is in the request (claim-v1.md §9), not staged earlier."""
        return self.result is not NO_RESULT

    def digest_of_result(self) -> str:
        return self.result_digest


@dataclass(frozen=True)
class CommitsInput(Input):
    """``POST /commits``' common items, each a task and its commit."""

    items: list[tuple[str, CommitInput]]

    def kwargs(self) -> dict[str, Any]:
        return {"items": [(task_id, item.kwargs()) for task_id, item in self.items]}
