"""The fold and retention jobs through a real Celery worker on Redis (they run eagerly in the other tests): with a
12-second retention window, the worker folds a finished task's records into /metrics' tallies and, once the window
has passed, prunes them, keeping the task's record. (The worker process has its own clock, so the window passes in
real time here: polled, not slept.)"""

from __future__ import annotations

import time

import pytest

from claims.models import MetricTally, StagedResult, Task, TaskEvent
from claims.tasks import fold_metrics, prune_history
from tests.support.processes import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_a_real_worker_folds_the_metrics_then_prunes_a_finished_task(worker_a, ready_task, celery_workers):
    celery_workers.start(METRICS_FOLD_LAG_SECONDS="1", ROLLOUT_WINDOW_SECONDS="5", RETENTION_SECONDS="12")
    worker_a.finish(worker_a.claim(ready_task).json(), "done")
    sent = {"at": 0.0}

    def pruned() -> bool:
        if time.monotonic() - sent["at"] > 2:  # what beat would send, every 2 s here
            fold_metrics.delay()
            prune_history.delay()
            sent["at"] = time.monotonic()
        return not TaskEvent.objects.filter(task_id=ready_task).exists()

    assert wait_for(pruned, seconds=90), celery_workers.log()[-3000:]
    assert MetricTally.objects.get(family="claims_commit", labels="outcome=COMMITTED").value == 1
    assert Task.objects.get(pk=ready_task).result == "done"
    assert StagedResult.objects.filter(task_id=ready_task, canonical=True).exists()
