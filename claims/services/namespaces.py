"""Namespaces, epoch fences and resume (claim-v1.md §7)."""

from __future__ import annotations

import uuid

from django.db import IntegrityError, transaction

from .. import clock
from ..errors import NamespaceExists, PauseHeld
from ..models import (
    Attempt,
    AttemptEnd,
    AuditEntry,
    EventKind,
    Namespace,
    Principal,
    Task,
    TaskEvent,
    TaskState,
)
from ..validation import real_text
from . import wakeups
from ._base import NamespaceHold, audit, namespace_lock, new_event


def namespace_create(*, principal: Principal, name: str) -> Namespace:
    """A new scheduler scope at epoch 1, audited. Composes into the caller's transaction (the rollout creates
    its own record of the namespace in the same one)."""
    with transaction.atomic():
        now = clock.now()
        if Namespace.objects.filter(name=name).exists():
            raise NamespaceExists(f"namespace {name!r} exists")
        try:
            with transaction.atomic():  # the unique index decides a race between two creators
                namespace = Namespace.objects.create(name=name, created_at=now, updated_at=now)
        except IntegrityError:
            raise NamespaceExists(f"namespace {name!r} exists") from None
        audit(principal=principal, action="namespace_create", at=now, namespace=name)
    return namespace


def fence_reason(reason: str | None) -> str:
    """A fence's rule, whoever asks (console, API, CLI, a rollback): a reason that is real text, trimmed."""
    return real_text(reason, why="A fence needs a reason: it goes to the audit log.")


def epoch_fence(
    *,
    principal: Principal,
    namespace: str,
    reason: str,
    fence_id: uuid.UUID | None = None,
    hold: str = "",
    pause: bool = True,
    action: str = "epoch_fence",
) -> Namespace:
    """Stop new claims and bump the epoch: every attempt granted before this moment is fenced at every
    acceptance point, whatever epoch it later sends. Composes into the caller's transaction (the on-call tools
    record their fence request in the same one); alone, it is one transaction of its own.

    ``fence_id`` makes the fence idempotent: a caller that runs again with the same id finds the fence recorded
    (under the namespace row lock, so two runs at once cannot both bump) and changes nothing.
    ``selectors.fence_epoch_of(fence_id)`` tells which epoch that fence started. ``hold`` names who alone may lift
    the pause (``namespace_release_hold``); until then resume is refused (PAUSE_HELD). ``pause=False``: the epoch
    moves and claims go on (a failover's system fence, ``serving_check``, leaves nothing to resume by hand); ``action``
    is the audit entry's.

    1. Lock the namespace row FOR NO KEY UPDATE — first, never after a FOR SHARE of it (two fences or a fence
       and a resume that both upgrade deadlock). The lock waits for every decision in flight (they hold it FOR
       SHARE), so none lands under the old epoch after this commits. The clock is read after it.
    2. Pause, epoch + 1 (and the hold, if given).
    3. End the attempts still open from earlier epochs (``_end_open_attempts``); those whose lease was live are
       the fence's figure, and get `epoch_fenced` on their task's timeline. The mark is a record; the refusal
       never depends on it — it compares epochs.
    4. Audit, with the principal and reason.
    """
    reason = fence_reason(reason)
    with transaction.atomic(savepoint=False):
        ns = namespace_lock(name=namespace)
        if (
            fence_id is not None
            and AuditEntry.objects.filter(
                action="epoch_fence", target=f"fence:{fence_id}", namespace=namespace
            ).exists()
        ):
            return Namespace.objects.get(pk=ns.id)
        epoch = ns.scheduler_epoch + 1
        changes: dict[str, object] = {"scheduler_epoch": epoch, "updated_at": ns.now}
        if pause:
            changes["claims_paused"] = True
        if hold and not ns.pause_hold:
            changes["pause_hold"] = hold
        Namespace.objects.filter(pk=ns.id).update(**changes)
        live = _end_open_attempts(ns, epoch, principal=principal, reason=reason)
        ns.audit(
            principal,
            action,
            target=f"fence:{fence_id}" if fence_id else "",
            reason=reason,
            detail={
                "scheduler_epoch": epoch,
                "fenced_attempts": len(live),
                **({"hold": hold} if hold else {}),
            },
        )
        # Each waiter answers: claims are paused, or (a failover's fence) the epoch it carries is old.
        wakeups.claimable(namespace, wakeups.EVERYONE)
        # The fenced attempts' keys are free for the tasks that list them — in other namespaces too.
        wakeups.keys_freed(
            key
            for keys in Task.objects.filter(pk__in=[row[0] for row in live], has_resources=True).values_list(
                "resources", flat=True
            )
            for key in keys
        )
        return Namespace.objects.get(pk=ns.id)


def _end_open_attempts(ns: NamespaceHold, epoch: int, *, principal: Principal, reason: str) -> list[tuple]:
    """Step 3 of a fence, under its lock: every attempt granted before ``epoch`` and not ended yet is ended FENCED.
    Only those whose lease was live — the task CLAIMED by it, unexpired — are the fence's figure and get
    `epoch_fenced` on their task's timeline: an attempt an earlier fence ended is not counted or marked again
    (issue 24: each fence said it ended them all again), nor is a lease that had already run out. Returns the live
    ones' (task, attempt, generation, epoch, owner)."""
    live = list(
        Task.objects.filter(
            namespace_id=ns.id,
            state=TaskState.CLAIMED,
            scheduler_epoch__lt=epoch,
            lease_expires_at__gt=ns.now,
            attempt_id__in=Attempt.objects.filter(namespace_id=ns.id, ended_at__isnull=True).values(
                "attempt_id"
            ),
        ).values_list("task_id", "attempt_id", "claim_generation", "scheduler_epoch", "owner_id")
    )
    Attempt.objects.filter(namespace_id=ns.id, ended_at__isnull=True, scheduler_epoch__lt=epoch).update(
        ended_at=ns.now, end_reason=AttemptEnd.FENCED
    )
    TaskEvent.objects.bulk_create(
        [
            new_event(
                EventKind.EPOCH_FENCED,
                **ns.on(
                    task_id,
                    principal,
                    attempt_id=attempt_id,
                    claim_generation=generation,
                    scheduler_epoch=attempt_epoch,
                    owner_id=owner,
                    detail={"reason": reason, "new_epoch": epoch},
                ),
            )
            for task_id, attempt_id, generation, attempt_epoch, owner in live
        ]
    )
    return live


def namespace_resume(*, principal: Principal, namespace: str, reason: str = "") -> Namespace:
    """Lift the pause. The epoch stays: attempts from before the fence stay fenced. Refused (PAUSE_HELD) while
    the pause is held — a rollback still draining holds it until it ends — whoever asks."""
    reason = (reason or "").strip()  # optional (claim-v1.md), audited when given
    with transaction.atomic(durable=True):
        ns = namespace_lock(name=namespace)
        if ns.pause_hold:
            raise PauseHeld(
                f"claims stay paused until {ns.pause_hold} ends; it lifts the hold itself",
                reason=ns.pause_hold.split(":", 1)[0].upper(),
                current={"claims_paused": ns.claims_paused, "pause_hold": ns.pause_hold},
            )
        Namespace.objects.filter(pk=ns.id).update(claims_paused=False, updated_at=ns.now)
        ns.audit(
            principal,
            "namespace_resume",
            reason=reason,
            detail={"was_paused": ns.claims_paused, "scheduler_epoch": ns.scheduler_epoch},
        )
        wakeups.claimable(namespace, wakeups.EVERYONE)  # fenced claims are claimable again
        return Namespace.objects.get(pk=ns.id)


def namespace_release_hold(*, namespace: str, hold: str) -> bool:
    """Lift ``hold`` from the pause (claims stay paused; resume is allowed again). Composes into the caller's
    transaction. Returns whether that hold was set."""
    with transaction.atomic(savepoint=False):
        ns = namespace_lock(name=namespace)
        return bool(
            Namespace.objects.filter(pk=ns.id, pause_hold=hold).update(pause_hold="", updated_at=ns.now)
        )
