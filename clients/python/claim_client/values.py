"""What the client answers with: a claim held, a commit's ids, an effect's ticket and result, and the two
exceptions of the effect helper."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


class EffectUnknown(Exception):
    """The external call timed out (or its reply was lost): recorded UNKNOWN. Reconcile before calling again."""

    def __init__(self, effect_id: str, cause: BaseException):
        super().__init__(f"effect {effect_id} outcome unknown: {cause!r}")
        self.effect_id = effect_id
        self.__cause__ = cause


class EffectFailed(Exception):
    """Raise it from ``call`` for a definite refusal by the target: recorded FAILED, safe to retry later."""


@dataclass
class Claim:
    task_id: str
    attempt_id: str
    scheduler_epoch: int
    claim_generation: int
    cancel_generation: int
    lease_expires_at: str
    input_digest: str
    state_version: int
    input: Any
    fences: dict[str, int]
    _deadline: float = field(default=0.0, repr=False)  # local monotonic time the lease surely ends by

    def remaining(self) -> float:
        """Seconds of lease left, measured from before the request that granted or renewed it (so never more than
        the server's), by this process's monotonic clock — independent of wall-clock skew."""
        return max(0.0, self._deadline - time.monotonic())


@dataclass(frozen=True)
class Committed:
    result_commit_id: str
    unblocked: list[str]
    staged_result_id: str | None = None  # the row an inline commit staged


@dataclass(frozen=True)
class EffectTicket:
    outcome: str  # PREPARED | RECONCILE_REQUIRED | ALREADY_COMMITTED | APPROVAL_REQUIRED
    effect_id: str
    state: str
    payload_digest: str

    @property
    def idempotency_key(self) -> str:
        return self.effect_id


@dataclass(frozen=True)
class EffectResult:
    effect_id: str
    state: str  # COMMITTED (or the state an operator's approval is awaited in)
    called: bool  # whether this call reached the target (False: already committed, or reconciled as OCCURRED)
    value: Any = None
