"""What the periodic jobs do, as plain functions (the Celery tasks in rollout/tasks.py only call these)."""

from __future__ import annotations

from claims.models import Task, TaskState

from ..legacy import LegacyVerdict, legacy_store
from ..models import Mismatch, MismatchReason
from .operations import COMPLETE, LEGACY
from .shadow import Seen, V1Verdict, compare


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
            Seen(task.namespace.name, task.task_id, row.completed_by, LEGACY),
            COMPLETE,
            LegacyVerdict(True, "COMPLETED", row.completed_by, None),
            V1Verdict(True, "COMMITTED"),
        )
        recorded += 1
    return recorded
