"""claim-v1.md §9's batch commit decided together (``task_commit_many``): every task row of the batch locked in
one statement, the clock read after all of those locks, each item judged as its single commit would be, and the
items the batch leaves to single commits (a task named twice, with successors, with resources) answered exactly
as those would. Against PostgreSQL over separate connections."""

from __future__ import annotations

import random
import time

import pytest

from claims.models import Resource, StagedResult, Task, TaskEvent
from tests.support.actors import make_actor
from tests.support.races import Pause, row_locked, run_in_thread, wait_for_lock_waiters

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RESULT = {"answer": 42}


def _item(worker, claim, result=RESULT, **override):
    return {"task_id": claim["task_id"], **worker.commit_body(claim, result, inline=True, **override)}


def test_the_batch_judges_each_lease_on_the_clock_read_after_every_task_lock(operator, db_clock):
    worker = make_actor("batcher", "worker")
    first, last = sorted(operator.create(node_id=f"n{i}").json()["task_id"] for i in range(2))
    long = worker.claim(first, ttl=30).json()
    short = worker.claim(last, ttl=5).json()
    lease = Task.objects.get(pk=last).lease_expires_at
    db_clock.travel((lease - db_clock.now()).total_seconds() - 1.5)  # 1.5 s of the short lease left

    # The batch locks `first`, then queues on `last` (task_id order) while the test holds it, and the short lease
    # runs out in real time meanwhile. Judged on a clock read before that wait — the one read with `first`'s lock
    # — the late commit would be accepted.
    with row_locked("SELECT 1 FROM claims_task WHERE task_id = %s FOR UPDATE", [last]):
        committing, box = run_in_thread(lambda: worker.commits([_item(worker, long), _item(worker, short)]))
        wait_for_lock_waiters(1)
        while db_clock.now() <= lease:  # polling the database clock, not sleeping to make the race
            time.sleep(0.05)
    committing.join(30)

    results = box["value"].json()["results"]
    assert [r["status"] for r in results] == [200, 409]
    assert (results[1]["body"]["outcome"], results[1]["body"]["reason"]) == ("FENCED", "LEASE_EXPIRED")
    assert Task.objects.get(pk=first).state == "COMMITTED"
    assert Task.objects.get(pk=last).state == "CLAIMED" and Task.objects.get(pk=last).result is None
    assert not StagedResult.objects.filter(task_id=last).exists()
    fenced = TaskEvent.objects.get(task_id=last, kind="fenced")
    assert fenced.detail == {"outcome": "FENCED", "reason": "LEASE_EXPIRED"} and fenced.point == "commit"


def test_a_fence_waits_for_a_batch_that_decided_and_the_batch_commits_under_the_epoch_it_read(operator):
    worker = make_actor("batcher", "worker")
    oncall = make_actor("pager", "oncall")
    tasks = [operator.create(node_id=f"n{i}").json()["task_id"] for i in range(3)]
    claims = [worker.claim(t).json() for t in tasks]
    pause = Pause("task_commit_many.judged")

    committing, box = run_in_thread(lambda: worker.commits([_item(worker, c) for c in claims]))
    pause.wait_reached()  # judged under epoch 1, every task and the namespace held
    fencing, fence_box = run_in_thread(lambda: oncall.post("/namespaces/default/fence", {"reason": "drill"}))
    wait_for_lock_waiters(1)  # the fence queues on the namespace row the batch holds FOR SHARE
    pause.resume()
    committing.join(30)
    fencing.join(30)

    assert [r["status"] for r in box["value"].json()["results"]] == [200, 200, 200]
    assert fence_box["value"].status_code == 200, fence_box["value"].json()
    assert set(Task.objects.filter(pk__in=tasks).values_list("state", flat=True)) == {"COMMITTED"}
    late = worker.commits([_item(worker, c, {"late": True}) for c in claims]).json()["results"]
    assert [r["body"]["outcome"] for r in late] == ["FENCED"] * 3


def test_batches_naming_the_same_tasks_in_any_order_commit_each_task_once(operator):
    tasks = [operator.create(node_id=f"n{i}").json()["task_id"] for i in range(10)]
    worker = make_actor("batcher", "worker")
    claims = [worker.claim(t).json() for t in tasks]

    def batch(seed: int):
        def go():
            mine = list(claims)
            random.Random(seed).shuffle(mine)
            return worker.commits([_item(worker, c, {"by": seed}) for c in mine])

        return go

    runs = [run_in_thread(batch(seed)) for seed in range(4)]
    for thread, _ in runs:
        thread.join(60)

    assert all("value" in box and box["value"].status_code == 200 for _, box in runs), runs
    won = [r["task_id"] for _, box in runs for r in box["value"].json()["results"] if r["status"] == 200]
    assert sorted(won) == sorted(tasks)  # each task committed by exactly one of the four
    assert StagedResult.objects.filter(task_id__in=tasks, canonical=True).count() == 10
    assert StagedResult.objects.filter(task_id__in=tasks).count() == 10  # the refused staged nothing


def test_items_the_batch_leaves_to_single_commits_are_answered_as_those_would(operator):
    worker = make_actor("batcher", "worker")
    operator.post("/resources", {"resource_key": "doc:1"})
    parent = operator.create(node_id="parent").json()["task_id"]
    child = operator.create(node_id="child", depends_on=[parent]).json()["task_id"]
    edit = operator.create(node_id="edit", resources=["doc:1"]).json()["task_id"]
    plain = operator.create(node_id="plain").json()["task_id"]
    parent_claim, edit_claim, plain_claim = (worker.claim(t).json() for t in (parent, edit, plain))
    doc = worker.get("/resources/doc:1").json()
    named = [{"resource_key": "doc:1", "incarnation": doc["incarnation"], "expected_revision": 0}]

    results = worker.commits(
        [
            _item(worker, plain_claim),
            _item(worker, parent_claim),
            _item(worker, edit_claim, resources=named),
            _item(worker, plain_claim),  # the same task again: the stored answer of the first
        ]
    ).json()["results"]

    assert [r["status"] for r in results] == [200, 200, 200, 200], results
    assert results[1]["body"]["unblocked"] == [child]
    assert results[3]["body"] == results[0]["body"]
    assert Task.objects.get(pk=child).state == "READY"
    assert Resource.objects.get(key_id="doc:1", deleted_at__isnull=True).revision == 1
    assert set(Task.objects.filter(pk__in=[parent, edit, plain]).values_list("state", flat=True)) == {
        "COMMITTED"
    }
    assert StagedResult.objects.filter(task_id=plain).count() == 1


@pytest.mark.django_db
def test_a_batch_of_commits_never_reads_the_tasks_inputs(operator, worker_a):
    """A commit needs its task's input digest, not its input (up to CLAIMS_MAX_VALUE_BYTES each): the batch's lock
    statement leaves the column out, and nothing reads it later (the task objects' inputs stay deferred)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    big = {"blob": "x" * 100_000}
    for _ in range(3):
        assert operator.create(node_id="n", input=big).status_code == 201
    claims = worker_a.claim_batch(3).json()["claims"]

    with CaptureQueriesContext(connection) as seen:
        done = worker_a.commits(
            [{"task_id": c["task_id"], **worker_a.commit_body(c, {"ok": 1}, inline=True)} for c in claims]
        )

    assert [r["status"] for r in done.json()["results"]] == [200, 200, 200]
    assert Task.objects.filter(state="COMMITTED").count() == 3
    assert not [q["sql"] for q in seen.captured_queries if '"input"' in q["sql"] or "t.*" in q["sql"]]
