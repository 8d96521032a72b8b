"""What the periodic jobs do, as plain functions (the Celery tasks in rollout/tasks.py only call these)."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction

from claims import clock, services
from claims.errors import Fenced
from claims.models import Namespace, Principal, Role, Task, TaskState
from claims.services._base import audit

from . import selectors
from .legacy import LegacyVerdict, legacy_store
from .models import Mismatch, MismatchReason
from .services import V1Verdict, compare


def fence_with_self_check(*, namespace: str, reason: str, principal: Principal) -> dict[str, Any]:
    """Fence, then check the fence: a commit carrying the old epoch (on any task of the namespace) must be
    refused with FENCED (EPOCH). The result is audited so the operator UI can show it."""
    fenced = services.epoch_fence(principal=principal, namespace=namespace, reason=reason)
    old_epoch = fenced.scheduler_epoch - 1
    probe = Task.objects.filter(namespace=fenced).order_by("created_at").first()
    if probe is None:
        check = {"ok": True, "detail": "no task to probe: nothing could commit under the old epoch"}
    else:
        checker, _ = Principal.objects.get_or_create(
            name="system:fence-self-check", defaults={"role": Role.ONCALL, "created_at": clock.now()}
        )
        try:
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
            check = {"ok": False, "detail": "an old-epoch commit was accepted"}
        except Fenced as exc:
            check = {
                "ok": exc.reason == "EPOCH",
                "detail": f"old-epoch commit refused: FENCED ({exc.reason})",
            }
        except Exception as exc:  # noqa: BLE001 - reported, not raised: the fence itself stands
            check = {"ok": probe.state == TaskState.COMMITTED, "detail": f"probe answered {exc!r}"}
    with transaction.atomic(durable=True):
        audit(
            principal=principal,
            action="fence_self_check",
            at=clock.now(),
            namespace=namespace,
            reason=reason,
            detail={"scheduler_epoch": fenced.scheduler_epoch, **check},
        )
    return {"namespace": namespace, "scheduler_epoch": fenced.scheduler_epoch, "self_check": check}


def coverage_figures(namespace: str) -> dict[str, Any]:
    ns = Namespace.objects.get(name=namespace)
    cov = selectors.coverage(ns)
    return {
        "namespace": namespace,
        "window_start": cov["window_start"].isoformat(),
        "points": {point: p["ratio"] for point, p in cov["points"].items()},
    }


def settle_winner_differs(*, namespace: str | None = None) -> int:
    """Where both stores accepted a commit but their canonical results differ, and no mismatch says so yet,
    record WINNER_DIFFERS (the inline comparison cannot see a later overwrite in the legacy table)."""
    recorded = 0
    tasks = Task.objects.filter(state=TaskState.COMMITTED).select_related("namespace")
    if namespace:
        tasks = tasks.filter(namespace__name=namespace)
    store = legacy_store()
    for task in tasks.iterator():
        row = store.get(task_id=task.task_id)
        if row is None or not row.result_digest or row.result_digest == task.result_digest:
            continue
        if Mismatch.objects.filter(
            task_id=task.task_id,
            reason__in=[MismatchReason.WINNER_DIFFERS, MismatchReason.STALE_COMMIT_ACCEPTED],
        ).exists():
            continue
        compare(
            namespace=task.namespace.name,
            task_id=task.task_id,
            operation="complete",
            api="legacy",
            owner_id=row.completed_by,
            legacy=LegacyVerdict(True, "COMPLETED", row.completed_by, None),
            v1=V1Verdict(True, "COMMITTED"),
        )
        recorded += 1
    return recorded
