"""Reads by stage (rollout.md): in LEGACY and SHADOW the legacy store is authoritative for who holds a task and
what its result is, so the task read and the frontier show the legacy view; from V1_READS on, claim.v1's."""

from __future__ import annotations

from typing import Any

from django.db.models import Case, CharField, Exists, OuterRef, Q, QuerySet, Subquery, Value, When

from claims import clock
from claims.models import Stage, Task, TaskState

from .models import LegacyClaim

LEGACY_READS = (Stage.LEGACY, Stage.SHADOW)


def with_legacy_state(tasks: QuerySet[Task]) -> QuerySet[Task]:
    """Annotate ``read_state``: the state a reader sees where the legacy store is authoritative."""
    now = clock.now()
    rows = LegacyClaim.objects.filter(task_id=OuterRef("pk"))
    completed = rows.exclude(completed_by="")
    held = rows.filter(completed_by="", expires_at__gt=now).exclude(owner_id="")
    legacy_reads = Q(namespace__stage__in=LEGACY_READS)
    return tasks.annotate(
        read_state=Case(
            When(~legacy_reads, then="state"),
            When(state__in=[TaskState.BLOCKED, TaskState.CANCELLED], then="state"),
            When(Exists(completed), then=Value(TaskState.COMMITTED)),
            When(Exists(held), then=Value(TaskState.CLAIMED)),
            default=Value(TaskState.READY),
            output_field=CharField(),
        ),
        legacy_owner=Subquery(held.values("owner_id")[:1]),
    )


def legacy_view(task: Task, body: dict[str, Any]) -> dict[str, Any]:
    """The task body as a reader sees it in LEGACY/SHADOW: legacy's holder, expiry and result."""
    if task.namespace.stage not in LEGACY_READS:
        return body
    row = LegacyClaim.objects.filter(pk=task.task_id).first()
    now = clock.now()
    view = dict(body, read_from="legacy")
    if task.state in (TaskState.BLOCKED, TaskState.CANCELLED):
        return view
    if row is not None and row.completed_by:
        view.update(
            state=TaskState.COMMITTED,
            result=row.result,
            result_digest=row.result_digest or None,
            owner_id=row.completed_by,
            lease_expires_at=None,
        )
    elif row is not None and row.owner_id and row.expires_at and row.expires_at > now:
        view.update(
            state=TaskState.CLAIMED,
            owner_id=row.owner_id,
            lease_expires_at=row.expires_at.isoformat(),
            result=None,
            result_digest=None,
        )
    else:
        view.update(
            state=TaskState.READY, owner_id=None, lease_expires_at=None, result=None, result_digest=None
        )
    return view
