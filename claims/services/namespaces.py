"""Namespaces, epoch fences and resume (claim-v1.md §7)."""

from __future__ import annotations

import uuid

from django.db import IntegrityError, transaction

from .. import clock
from ..errors import NamespaceExists
from ..models import (
    Attempt,
    AttemptEnd,
    AuditEntry,
    EventKind,
    Namespace,
    Principal,
    Protocol,
    Stage,
    Task,
    TaskEvent,
    TaskState,
)
from ._base import audit, hold_namespace, new_event


def namespace_create(
    *, principal: Principal, name: str, stage: str = Stage.V1_ONLY, min_protocol: str = Protocol.LEGACY
) -> Namespace:
    """A new scheduler scope at epoch 1. A namespace being migrated from the legacy table starts at LEGACY."""
    with transaction.atomic(durable=True):
        now = clock.now()
        if Namespace.objects.filter(name=name).exists():
            raise NamespaceExists(f"namespace {name!r} exists")
        try:
            with transaction.atomic():  # the unique index decides a race between two creators
                namespace = Namespace.objects.create(
                    name=name, stage=stage, min_protocol=min_protocol, created_at=now, updated_at=now
                )
        except IntegrityError:
            raise NamespaceExists(f"namespace {name!r} exists") from None
        audit(
            principal=principal,
            action="namespace_create",
            at=now,
            namespace=name,
            detail={"stage": stage, "min_protocol": min_protocol},
        )
    return namespace


def epoch_fence(
    *, principal: Principal, namespace: str, reason: str, fence_id: uuid.UUID | None = None
) -> Namespace:
    """Stop new claims and bump the epoch: every attempt granted before this moment is fenced at every
    acceptance point, whatever epoch it later sends.

    ``fence_id`` makes the fence idempotent: a job that died after the fence committed and runs again with the
    same id finds the fence recorded (under the namespace row lock, so two runs at once cannot both bump) and
    changes nothing. ``selectors.fence_epoch_of(fence_id)`` tells which epoch that fence started.

    1. UPDATE the namespace row: pause, epoch + 1. The row lock waits for every decision in flight (they hold
       it FOR SHARE), so none lands under the old epoch after this commits.
    2. Mark the live attempts FENCED and append `epoch_fenced` to each of their tasks' timelines. The mark is a
       record; the refusal never depends on it — it compares epochs.
    3. Audit, with the principal and reason.
    """
    with transaction.atomic(durable=True):
        ns = hold_namespace(name=namespace)
        row = Namespace.objects.select_for_update(no_key=True).get(pk=ns.id)
        if (
            fence_id is not None
            and AuditEntry.objects.filter(action="epoch_fence", target=f"fence:{fence_id}").exists()
        ):
            return row
        row.scheduler_epoch += 1
        row.claims_paused = True
        row.updated_at = ns.now
        row.save(update_fields=["scheduler_epoch", "claims_paused", "updated_at"])
        live = list(
            Task.objects.filter(
                namespace_id=ns.id, state=TaskState.CLAIMED, scheduler_epoch__lt=row.scheduler_epoch
            ).values_list("task_id", "attempt_id", "claim_generation", "scheduler_epoch", "owner_id")
        )
        Attempt.objects.filter(
            namespace_id=ns.id, ended_at__isnull=True, scheduler_epoch__lt=row.scheduler_epoch
        ).update(ended_at=ns.now, end_reason=AttemptEnd.FENCED)
        TaskEvent.objects.bulk_create(
            [
                new_event(
                    EventKind.EPOCH_FENCED,
                    namespace_id=ns.id,
                    task_id=task_id,
                    at=ns.now,
                    principal=principal,
                    attempt_id=attempt_id,
                    claim_generation=generation,
                    scheduler_epoch=epoch,
                    owner_id=owner,
                    detail={"reason": reason, "new_epoch": row.scheduler_epoch},
                )
                for task_id, attempt_id, generation, epoch, owner in live
            ]
        )
        audit(
            principal=principal,
            action="epoch_fence",
            at=ns.now,
            namespace=namespace,
            target=f"fence:{fence_id}" if fence_id else "",
            reason=reason,
            detail={"scheduler_epoch": row.scheduler_epoch, "fenced_attempts": len(live)},
        )
    return row


def namespace_resume(*, principal: Principal, namespace: str, reason: str = "") -> Namespace:
    """Lift the pause. The epoch stays: attempts from before the fence stay fenced."""
    with transaction.atomic(durable=True):
        ns = hold_namespace(name=namespace)
        row = Namespace.objects.select_for_update(no_key=True).get(pk=ns.id)
        was_paused = row.claims_paused
        row.claims_paused = False
        row.updated_at = ns.now
        row.save(update_fields=["claims_paused", "updated_at"])
        audit(
            principal=principal,
            action="namespace_resume",
            at=ns.now,
            namespace=namespace,
            reason=reason,
            detail={"was_paused": was_paused, "scheduler_epoch": row.scheduler_epoch},
        )
    return row


def namespace_set_stage(
    *, principal: Principal | None, namespace: str, stage: str, reason: str = ""
) -> Namespace:
    """Record a namespace's rollout stage (the rollout app decides when; this only writes it, audited)."""
    with transaction.atomic(durable=True):
        ns = hold_namespace(name=namespace)
        row = Namespace.objects.select_for_update(no_key=True).get(pk=ns.id)
        previous = row.stage
        row.stage, row.updated_at = stage, ns.now
        row.save(update_fields=["stage", "updated_at"])
        if principal is not None:
            audit(
                principal=principal,
                action="namespace_set_stage",
                at=ns.now,
                namespace=namespace,
                reason=reason,
                detail={"from": previous, "to": stage},
            )
    return row
