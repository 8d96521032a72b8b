"""The rollout's side of retention (issue 13 item 8): a task with a mismatch under review keeps its whole history in
the core; the rollout's per-operation records go once old, but the newest gate evaluation of each move and the two
newest drain snapshots of each pool stay (the gates and the console read them)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from claims import clock
from claims.models import TaskEvent
from claims.services.metrics import metrics_fold
from claims.services.retention import history_prune
from rollout.models import ComparedOperation, DrainSnapshot, GateEvaluation, Mismatch, MismatchStatus
from rollout.services.retention import rollout_history_prune


@pytest.fixture
def retention(settings):
    settings.RETENTION_SECONDS = 100
    settings.METRICS_FOLD_LAG_SECONDS = 0
    settings.ROLLOUT_WINDOW_SECONDS = 50


def _mismatch(task_id: str, status: str) -> Mismatch:
    return Mismatch.objects.create(
        namespace="default", task_id=task_id, operation="complete", api="legacy", legacy={}, v1={},
        reason="STALE_COMMIT_ACCEPTED", status=status, at=clock.now(),
    )  # fmt: skip


def test_a_task_with_a_mismatch_under_review_keeps_its_history_until_it_is_reviewed(
    retention, operator, worker_a, ready_task, db_clock
):
    worker_a.finish(worker_a.claim(ready_task).json(), "done")
    mismatch = _mismatch(ready_task, MismatchStatus.OPEN)
    db_clock.travel(200)
    metrics_fold()

    kept = history_prune()
    reviewed = operator.post(
        f"/mismatches/{mismatch.pk}/review", {"status": "EXPLAINED", "note": "known race"}
    )
    assert reviewed.status_code == 200, reviewed.content
    pruned = history_prune()

    assert kept.events == 0 and pruned.events > 0
    assert not TaskEvent.objects.filter(task_id=ready_task).exists()


def test_old_per_operation_records_go_and_the_newest_gate_and_snapshots_stay(retention, db, db_clock):
    now = clock.now()
    for minutes in (10, 9, 8):
        at = now - timedelta(minutes=minutes)
        ComparedOperation.objects.create(namespace="ns", operation="claim", api="legacy", agreed=True, at=at)
        GateEvaluation.objects.create(
            namespace="ns", move="SHADOW → V1_READS", holds=False, figures={}, why="", at=at
        )
        DrainSnapshot.objects.create(
            namespace="ns", pool="legacy", active_leases=0, unknown_effects=0, awaiting_commit=0,
            is_clean=True, clean_streak=1, taken_at=at,
        )  # fmt: skip
    recent = ComparedOperation.objects.create(
        namespace="ns", operation="claim", api="legacy", agreed=True, at=now
    )

    out = rollout_history_prune()

    assert list(ComparedOperation.objects.values_list("pk", flat=True)) == [recent.pk]
    assert list(GateEvaluation.objects.values_list("at", flat=True)) == [now - timedelta(minutes=8)]
    assert sorted(DrainSnapshot.objects.values_list("taken_at", flat=True)) == [
        now - timedelta(minutes=9),
        now - timedelta(minutes=8),
    ]
    assert out["compared_operations"] == 3 and out["gate_evaluations"] == 2 and out["drain_snapshots"] == 1
