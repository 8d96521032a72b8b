"""On-call's epoch fences — the one way the API, the console and the CLI fence (``fence``): in the caller's request,
one transaction pauses the namespace, bumps its epoch, ends the live attempts and records the durable request, so
nothing waits for a job. Then the self-check (``fence_check``) — a commit carrying the old epoch must come back
FENCED (EPOCH) — and its verdict, on the request and in the audit log: run at once by the API and the CLI, by the
``fence_epoch`` job from the console, and sent again (``resend_fences``) while unfinished — so a job worker killed
before, during or after the check neither loses it nor records it twice. Two checks of one request at once: the
second finds the request's advisory lock taken and leaves it to the first.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F

from claims import clock, selectors, services
from claims.errors import Fenced, Forbidden, Invalid
from claims.locks import singleton
from claims.models import AuditEntry, Principal, Role, Task, TaskState
from claims.services import audit

from .models import FenceRequest


def fence(
    *, principal: Principal, namespace: str, reason: str, fence_id: uuid.UUID | None = None
) -> FenceRequest:
    """Fence now and record the request, in one transaction: the namespace row locked first (claims'
    ``epoch_fence``: pause, epoch + 1, live attempts ended, audited), then the request inserted with the new
    epoch and the fence's clock. Idempotent on ``fence_id`` (the console's form carries one: a second submit of
    the same form finds its fence and fences nothing more). The self-check is the caller's next step."""
    if principal.role != Role.ONCALL:
        raise Forbidden("an epoch fence is oncall's")
    reason = services.fence_reason(reason)
    fence_id = fence_id or uuid.uuid4()
    # A request's namespace never changes: an id already used for another namespace (a form from another page)
    # would otherwise "find" that fence and fence nothing here.
    elsewhere = FenceRequest.objects.filter(pk=fence_id).exclude(namespace=namespace).values_list("namespace")
    if (other := elsewhere.first()) is not None:
        raise Invalid({"fence_id": [f"this fence form belongs to namespace {other[0]}, not {namespace}"]})
    with transaction.atomic(durable=True):
        services.epoch_fence(principal=principal, namespace=namespace, reason=reason, fence_id=fence_id)
        existing = FenceRequest.objects.filter(pk=fence_id).first()
        if existing is not None:
            return existing
        fenced = AuditEntry.objects.get(action="epoch_fence", target=f"fence:{fence_id}")
        return FenceRequest.objects.create(
            fence_id=fence_id,
            namespace=namespace,
            reason=reason,
            principal=principal.name,
            requested_at=fenced.at,
            scheduler_epoch=fenced.detail["scheduler_epoch"],
        )


def fence_check(*, fence_id: uuid.UUID | str) -> FenceRequest:
    """The self-check of a recorded fence, once whatever the number of runs; returns the request as it stands. A
    request recorded by an earlier release before its fence (no epoch yet) is fenced first, idempotently."""
    with singleton(f"fence:{fence_id}") as got:
        request = FenceRequest.objects.get(pk=fence_id)
        if not got or request.finished_at is not None:
            return request
        FenceRequest.objects.filter(pk=fence_id).update(runs=F("runs") + 1)
        principal = Principal.objects.get(name=request.principal)
        if request.scheduler_epoch is None:
            services.epoch_fence(
                principal=principal, namespace=request.namespace, reason=request.reason, fence_id=request.pk
            )
        epoch = selectors.fence_epoch_of(request.pk)
        assert epoch is not None  # the fence above, or the request's own transaction, recorded it
        check = _self_check(namespace=request.namespace, old_epoch=epoch - 1)
        with transaction.atomic(durable=True):
            now = clock.now()
            locked = FenceRequest.objects.select_for_update().get(pk=fence_id)
            if locked.finished_at is None:
                locked.scheduler_epoch, locked.self_check, locked.finished_at = epoch, check, now
                locked.save(update_fields=["scheduler_epoch", "self_check", "finished_at"])
                audit(
                    principal=principal,
                    action="fence_self_check",
                    at=now,
                    namespace=request.namespace,
                    target=f"fence:{request.pk}",
                    reason=request.reason,
                    detail={"scheduler_epoch": epoch, **check},
                )
        return locked


def fence_check_later(request: FenceRequest) -> None:
    """The self-check sent as the ``oncall.fence_epoch`` job (the console's path: its request returns at once).
    Raises the broker's error when the queue is unreachable — the fence stands, and ``resend_fences`` sends the
    check once the queue is back."""
    services.enqueue(
        "oncall.fence_epoch", request.namespace, request.reason, request.principal, str(request.pk)
    )


def fence_now(*, principal: Principal, namespace: str, reason: str) -> FenceRequest:
    """Fence and check at once (the API, the ``fence`` command, and ``fence_epoch`` called without a request)."""
    return fence_check(fence_id=fence(principal=principal, namespace=namespace, reason=reason).pk)


def fences_unfinished(*, older_than_seconds: int | None = None) -> list[FenceRequest]:
    """Requests whose self-check has not finished within ``FENCE_RESEND_AFTER_SECONDS``: its job's worker died or
    its message was lost. ``resend_fences`` sends each again. (The fence itself is never waiting: it was made in
    the request.)"""
    window = timedelta(seconds=older_than_seconds or settings.FENCE_RESEND_AFTER_SECONDS)
    return list(
        FenceRequest.objects.filter(finished_at__isnull=True, requested_at__lt=clock.now() - window).order_by(
            "requested_at"
        )[:100]
    )


def _self_check(*, namespace: str, old_epoch: int) -> dict[str, Any]:
    """A commit carrying the old epoch (on the namespace's oldest task) must be refused with FENCED (EPOCH)."""
    probe = Task.objects.filter(namespace__name=namespace).order_by("created_at").first()
    if probe is None:
        return {"ok": True, "detail": "no task to probe: nothing could commit under the old epoch"}
    checker, _ = Principal.objects.get_or_create(
        name="system:fence-self-check", defaults={"role": Role.ONCALL, "created_at": clock.now()}
    )
    try:
        # Synthetic: the probe's refusal is neither traffic on the task's timeline nor a validated request
        # toward any gate's coverage.
        with services.synthetic():
            services.task_commit(
                principal=checker,
                task_id=probe.task_id,
                attempt_id=uuid.uuid4(),
                scheduler_epoch=old_epoch,
                claim_generation=probe.claim_generation,
                observed_cancel_generation=probe.cancel_generation,
                input_digest=probe.input_digest,
                result_digest="sha256:" + "0" * 64,
            )
        return {"ok": False, "detail": "an old-epoch commit was accepted"}
    except Fenced as exc:
        return {"ok": exc.reason == "EPOCH", "detail": f"old-epoch commit refused: FENCED ({exc.reason})"}
    except Exception as exc:  # noqa: BLE001 - reported, not raised: the fence itself stands
        return {"ok": probe.state == TaskState.COMMITTED, "detail": f"probe answered {exc!r}"}
