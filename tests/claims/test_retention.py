"""Retention (issue 13 item 8): a finished task's timeline and discarded attempts go once older than the window and
counted by /metrics; a live task, a task with an open effect, the canonical result and what /metrics has not folded
stay; counters do not move; a stray DELETE of the append-only timeline is still refused."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, transaction

from claims.models import Attempt, AuditEntry, StagedResult, Task, TaskEvent
from claims.services.metrics import metrics_fold
from claims.services.retention import history_prune
from tests.claims.test_metrics_fold import NOT_FROM_THE_RECORDS
from tests.support.races import Pause, run_in_thread


@pytest.fixture
def retention(settings):
    settings.RETENTION_SECONDS = 100
    settings.AUDIT_RETENTION_SECONDS = 150
    settings.METRICS_FOLD_LAG_SECONDS = 0
    settings.ROLLOUT_WINDOW_SECONDS = 50  # shorter than retention, as settings insist


def _figures(text: str) -> dict[str, float]:
    return {
        name: float(value)
        for line in text.splitlines()
        if line.startswith("claims_")
        and "fold_age" not in line
        and "_created" not in line
        and not line.startswith(NOT_FROM_THE_RECORDS)  # this process's request timings, the jobs' ages
        for name, _, value in [line.rpartition(" ")]
    }


def test_a_finished_task_loses_its_timeline_and_discarded_attempts_and_the_rest_stays(
    retention, anonymous, operator, worker_a, worker_b, ready_task, db_clock
):
    first = worker_a.claim(ready_task, ttl=5).json()
    worker_a.stage(first, "a's")  # staged, never committed
    db_clock.travel(6)
    winner = worker_b.claim(ready_task).json()
    committed = worker_b.finish(winner, "done").json()  # A's attempt is discarded (RECLAIMED)
    live = operator.create().json()["task_id"]
    worker_a.claim(live, ttl=300)
    with_effect = operator.create().json()["task_id"]
    claim = worker_a.claim(with_effect).json()
    effect = worker_a.prepare(claim, "notify", 1).json()["effect_id"]
    worker_a.outcome(claim, effect, "UNKNOWN")
    assert operator.post(f"/tasks/{with_effect}/cancel", {"reason": "stop"}).status_code == 200
    db_clock.travel(200)
    metrics_fold()
    before = anonymous.get("/metrics").content.decode()

    pruned = history_prune()

    assert pruned.events > 0 and pruned.attempts == 2 and pruned.staged_results == 1 and not pruned.more
    assert pruned.audit_entries > 0
    assert not TaskEvent.objects.filter(task_id=ready_task).exists()
    assert not Attempt.objects.filter(task_id=ready_task).exists()
    # The record of what was committed stays: the task row and its canonical result, and a repeat of the commit
    # still answers as it did.
    assert list(StagedResult.objects.filter(task_id=ready_task).values_list("canonical", flat=True)) == [True]
    assert Task.objects.get(pk=ready_task).result == "done"
    again = worker_b.commit(winner, "done")
    assert again.status_code == 200 and again.json()["result_commit_id"] == committed["result_commit_id"]
    assert TaskEvent.objects.filter(task_id=live).exists()  # live: claimed, never finished
    assert TaskEvent.objects.filter(task_id=with_effect).exists()  # finished, but its effect is UNKNOWN
    assert Attempt.objects.filter(task_id=with_effect).exists()
    assert not AuditEntry.objects.exists()
    assert _figures(anonymous.get("/metrics").content.decode()) == _figures(before)  # counters never go back


def test_nothing_metrics_has_not_folded_is_pruned(retention, worker_a, ready_task, db_clock):
    worker_a.finish(worker_a.claim(ready_task).json(), "done")
    db_clock.travel(200)  # old enough, but never folded

    pruned = history_prune()

    assert pruned.events == 0 and TaskEvent.objects.filter(task_id=ready_task).exists()


def test_retention_off_keeps_everything(settings, worker_a, ready_task, db_clock):
    settings.RETENTION_SECONDS, settings.METRICS_FOLD_LAG_SECONDS = 0, 0
    worker_a.finish(worker_a.claim(ready_task).json(), "done")
    db_clock.travel(10**7)
    metrics_fold()

    assert history_prune().events == 0 and TaskEvent.objects.filter(task_id=ready_task).exists()


@pytest.mark.postgres
def test_a_stray_delete_of_the_timeline_is_still_refused(worker_a, ready_task):
    worker_a.claim(ready_task)

    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        TaskEvent.objects.filter(task_id=ready_task).delete()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_task_requeued_after_the_prune_chose_its_records_keeps_them(
    retention, operator, worker_a, ready_task, db_clock
):
    """The prune has chosen the cancelled task's events (it was finished and old); the operator requeues it and
    commits before the prune deletes. The prune must see the task live again under its row lock and keep them."""
    worker_a.claim(ready_task)
    assert operator.post(f"/tasks/{ready_task}/cancel", {"reason": "later"}).status_code == 200
    db_clock.travel(200)
    metrics_fold()
    events = TaskEvent.objects.filter(task_id=ready_task).count()
    pause = Pause("history_prune.chosen")
    thread, box = run_in_thread(history_prune)
    pause.wait_reached()

    assert operator.post(f"/tasks/{ready_task}/requeue", {}).status_code == 200
    pause.resume()
    thread.join(30)

    assert "error" not in box, box
    assert Task.objects.get(pk=ready_task).state == "READY"
    assert TaskEvent.objects.filter(task_id=ready_task).count() == events + 1  # all kept, plus the requeue's
