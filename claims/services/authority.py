"""Authority at the acceptance points (claim-v1.md §1–§6): who may act on a task, as which attempt, now.

Every acceptance point — claim, renew, release, commit, and each effect call — is one ``acceptance_point``
block: the request is logged as a `fenced` event if it is refused (``RejectionLog``), it runs in one transaction,
and the task row is locked FOR NO KEY UPDATE with its namespace FOR SHARE before anything is decided, the clock
read after the locks (``hold_task``). Inside, the service calls the checks its endpoint documents, in the
contract's order, on the ``Acceptance`` the block yields:

- ``require_owner``: the token acts as ``owner_id`` (403);
- ``resolve_attempt``: the attempt named is this task's and the caller's (403), and the epoch it was granted
  under;
- ``require_epoch_and_pause``: a claim carries the current epoch (FENCED EPOCH), claims are not paused;
- ``require_not_cancelled``: CANCELLED;
- ``require_current_attempt``: FENCED — EPOCH (the epoch rule: the carried epoch is old, or the attempt was
  granted before a fence), GENERATION, ATTEMPT, OWNER;
- ``require_live_lease``: the lease has not run out, judged on the clock read after every lock
  (``Acceptance.after`` moves the clock when a service takes a further lock, such as its resource keys).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from ..errors import Cancelled, ClaimsPaused, Conflict, Fenced, Forbidden
from ..models import Attempt, Principal, ResourceKey, Task, TaskState
from ._base import NamespaceHold, RejectionLog, hold_task, run_guard, task_current
from .resources import lock_keys


def require_owner(principal: Principal, owner_id: str) -> None:
    if principal.owner_id != owner_id:
        raise Forbidden(f"this token acts as {principal.owner_id!r}, not {owner_id!r}")


def require_epoch_and_pause(ns: NamespaceHold, scheduler_epoch: int) -> None:
    """A claim's gate: the carried epoch is the namespace's, and claims are not paused."""
    if scheduler_epoch != ns.scheduler_epoch:
        raise Fenced(
            f"scheduler_epoch {scheduler_epoch} is not the namespace's current epoch {ns.scheduler_epoch}",
            reason="EPOCH",
            current={"scheduler_epoch": ns.scheduler_epoch},
        )
    if ns.claims_paused:
        raise ClaimsPaused(
            f"claims are paused in namespace {ns.name}",
            current={"scheduler_epoch": ns.scheduler_epoch, "claims_paused": True},
        )


def resolve_attempt(task: Task, attempt_id: uuid.UUID, principal: Principal) -> int | None:
    """The epoch ``attempt_id`` was granted under, or None when no such attempt of this task exists.

    Raises Forbidden when the attempt belongs to another owner: a worker acts only on its own attempts.
    The current attempt is read off the locked task row; only an older one costs a query.
    """
    if task.attempt_id == attempt_id:
        owner, epoch = task.owner_id, task.scheduler_epoch
    else:
        row = (
            Attempt.objects.filter(pk=attempt_id, task_id=task.pk)
            .values_list("owner_id", "scheduler_epoch")
            .first()
        )
        if row is None:
            return None
        owner, epoch = row
    if owner != principal.owner_id:
        raise Forbidden(f"attempt {attempt_id} is not {principal.owner_id!r}'s")
    return epoch


@dataclass
class Acceptance:
    """One request at an acceptance point, inside its transaction: the task as locked, its namespace as held,
    and what the request names."""

    principal: Principal
    ns: NamespaceHold
    task: Task
    attempt_id: Any = None
    claim_generation: int | None = None
    scheduler_epoch: int | None = None
    owner_id: str | None = None
    granted_epoch: int | None = field(default=None)
    point: str = ""

    def event_fields(self, *, holder: bool = False, detail: dict[str, Any] | None = None) -> dict[str, Any]:
        """This request's timeline row at its acceptance point, but for its kind: the namespace's clock and epoch
        as held, the attempt and generation named, the owner named (``holder``: the task's, as locked)."""
        return {
            "namespace_id": self.ns.id,
            "task_id": self.task.pk,
            "at": self.ns.now,
            "principal": self.principal,
            "attempt_id": self.attempt_id,
            "claim_generation": self.claim_generation,
            "scheduler_epoch": self.ns.scheduler_epoch,
            "owner_id": self.task.owner_id if holder else self.owner_id,
            "point": self.point,
            "detail": detail,
        }

    @property
    def current(self) -> dict[str, Any]:
        """The authoritative values a client needs after a 409 (claim-v1.md §2)."""
        return task_current(self.task, self.ns)

    def hold_keys(self) -> list[ResourceKey]:
        """The task's resource keys FOR SHARE, in key order — the last lock of the order (after the task, and the
        effect where there is one) — and the clock read again after them."""
        if not self.task.resources:
            return []
        keys, db_now = lock_keys(sorted(self.task.resources), lock="FOR SHARE")
        self.after(db_now)
        return keys

    def after(self, db_now: Any) -> None:
        """A further lock was taken (resource keys, an effect row): judge on the clock read after it."""
        self.ns = self.ns.at(db_now)

    def require_owner(self) -> None:
        if self.owner_id is not None:
            require_owner(self.principal, self.owner_id)

    def resolve_attempt(self) -> None:
        self.granted_epoch = resolve_attempt(self.task, self.attempt_id, self.principal)

    def require_epoch_and_pause(self) -> None:
        assert self.scheduler_epoch is not None
        require_epoch_and_pause(self.ns, self.scheduler_epoch)

    def require_not_cancelled(self, cancel_generation: int | None = None) -> None:
        """CANCELLED when the task is cancelled, or when the cancel generation the worker observed is old."""
        if self.task.state == TaskState.CANCELLED or (
            cancel_generation is not None and cancel_generation != self.task.cancel_generation
        ):
            raise Cancelled("the task was cancelled", current=self.current)

    def require_current_attempt(self, *, check_owner: bool = True) -> None:
        """FENCED unless the request names the task's current, live-by-epoch attempt. Reasons in order: EPOCH
        (the carried epoch is old, or the attempt was granted before a fence — re-sending the new epoch does not
        revive it), GENERATION, ATTEMPT (another attempt, or the attempt has ended), OWNER."""
        task, ns, current = self.task, self.ns, self.current
        if self.scheduler_epoch != ns.scheduler_epoch or (
            self.granted_epoch is not None and self.granted_epoch != ns.scheduler_epoch
        ):
            raise Fenced("an epoch fence ended this attempt: claim again", reason="EPOCH", current=current)
        if self.claim_generation != task.claim_generation:
            raise Fenced(
                f"claim_generation {self.claim_generation} is not current ({task.claim_generation})",
                reason="GENERATION",
                current=current,
            )
        if self.attempt_id != task.attempt_id or task.state != TaskState.CLAIMED:
            raise Fenced("this attempt is not the task's current claim", reason="ATTEMPT", current=current)
        if check_owner and self.owner_id is not None and self.owner_id != task.owner_id:
            raise Fenced("the claim belongs to another owner", reason="OWNER", current=current)

    def require_live_lease(self, refusal: type[Conflict] = Fenced, detail: str = "the lease ran out") -> None:
        """The lease has not run out on the clock read after the locks: renew's word is EXPIRED, the commit's
        and the effect calls' FENCED (LEASE_EXPIRED)."""
        if self.task.lease_expires_at is None or self.task.lease_expires_at <= self.ns.now:
            reason = "LEASE_EXPIRED" if refusal is Fenced else None
            raise refusal(detail, reason=reason, current=self.current)


@dataclass(frozen=True)
class Named:
    """What a request names at an acceptance point: the attempt and its generation, the epoch it carries, the owner
    (each None where the request names none: a claim names no attempt)."""

    attempt_id: Any = None
    claim_generation: int | None = None
    scheduler_epoch: int | None = None
    owner_id: str | None = None

    def fields(self) -> dict[str, Any]:
        return {
            "attempt_id": self.attempt_id,
            "claim_generation": self.claim_generation,
            "scheduler_epoch": self.scheduler_epoch,
            "owner_id": self.owner_id,
        }


@contextmanager
def acceptance_point(point: str, *, principal: Principal, task_id: str, named: Named) -> Iterator[Acceptance]:
    """One request at ``point`` on ``task_id``: logged if refused, one transaction, the task row and its
    namespace held and the clock read after them. The block's checks are the caller's, in its endpoint's order."""
    log = RejectionLog(point, principal=principal, task_id=task_id, **named.fields())
    with log, transaction.atomic(durable=True):
        ns, task = hold_task(task_id)
        log.namespace_id = ns.id
        run_guard(point, ns)
        yield Acceptance(principal=principal, ns=ns, task=task, **named.fields(), point=point)
