"""A20: a successor becomes READY only by its predecessor's canonical commit."""

from __future__ import annotations

import threading

import pytest

from claims.models import Task, TaskEvent
from tests.support.actors import make_actor
from tests.support.races import run_in_thread


def test_a20_a_successor_waits_blocked_and_is_released_only_by_the_canonical_commit(
    operator, worker_a, worker_b, db_clock
):
    parent = operator.create(node_id="parse").json()["task_id"]
    child = operator.create(node_id="typecheck", depends_on=[parent]).json()
    assert child["state"] == "BLOCKED"

    claim_a = worker_a.claim(parent, ttl=5).json()
    worker_a.stage(claim_a, {"ast": "a"})
    assert Task.objects.get(pk=child["task_id"]).state == "BLOCKED"  # a staged result releases nothing
    db_clock.travel(6)
    claim_b = worker_b.claim(parent).json()
    assert worker_a.commit(claim_a, {"ast": "a"}).status_code == 409  # a fenced result releases nothing
    assert Task.objects.get(pk=child["task_id"]).state == "BLOCKED"
    assert worker_b.claim(child["task_id"]).json()["reason"] == "STATE"

    committed = worker_b.finish(claim_b, {"ast": "b"})

    assert committed.json()["unblocked"] == [child["task_id"]]
    successor = Task.objects.get(pk=child["task_id"])
    assert successor.state == "READY" and successor.state_version == 2
    assert TaskEvent.objects.filter(task_id=child["task_id"], kind="unblocked").count() == 1
    assert worker_a.get(f"/tasks/{parent}").json()["result"] == {"ast": "b"}  # what the successor reads


def test_a_task_with_two_predecessors_waits_for_both(operator, worker_a):
    first = operator.create(node_id="a").json()["task_id"]
    second = operator.create(node_id="b").json()["task_id"]
    child = operator.create(node_id="join", depends_on=[first, second]).json()["task_id"]

    one = worker_a.finish(worker_a.claim(first).json(), 1)
    assert one.json()["unblocked"] == [] and Task.objects.get(pk=child).state == "BLOCKED"
    two = worker_a.finish(worker_a.claim(second).json(), 2)

    assert two.json()["unblocked"] == [child] and Task.objects.get(pk=child).state == "READY"


def test_a_task_created_after_its_predecessor_committed_is_ready(operator, worker_a):
    parent = operator.create().json()["task_id"]
    worker_a.finish(worker_a.claim(parent).json(), "done")

    child = operator.create(depends_on=[parent]).json()

    assert child["state"] == "READY"


def test_a_cancelled_and_requeued_successor_is_blocked_again_while_its_predecessor_runs(operator):
    parent = operator.create().json()["task_id"]
    child = operator.create(depends_on=[parent]).json()["task_id"]
    operator.post(f"/tasks/{child}/cancel", {"reason": "pause branch"})

    requeued = operator.post(f"/tasks/{child}/requeue")

    assert requeued.json()["state"] == "BLOCKED" and requeued.json()["cancel_generation"] == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_predecessors_committing_at_once_still_release_their_successor(operator):
    """Each commit sees the other's predecessor uncommitted unless they serialise on the successor row."""
    workers = [make_actor("left", "worker"), make_actor("right", "worker")]
    for round_number in range(10):
        parents = [operator.create(node_id=f"p{round_number}").json()["task_id"] for _ in range(2)]
        child = operator.create(node_id=f"c{round_number}", depends_on=parents).json()["task_id"]
        claims = []
        for worker, parent in zip(workers, parents, strict=True):
            claim = worker.claim(parent).json()
            worker.stage(claim, round_number)
            claims.append(claim)
        barrier = threading.Barrier(2)

        def commit(worker, claim, barrier=barrier, result=round_number):
            barrier.wait(10)
            return worker.commit(claim, result).status_code

        threads = [run_in_thread(lambda w=w, c=c: commit(w, c)) for w, c in zip(workers, claims, strict=True)]
        for thread, _ in threads:
            thread.join(30)
        assert [box["value"] for _, box in threads] == [200, 200]
        assert Task.objects.get(pk=child).state == "READY", f"round {round_number}: successor stranded"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_successor_created_while_its_predecessor_commits_is_never_stranded(operator):
    worker = make_actor("committer", "worker")
    for round_number in range(10):
        parent = operator.create(node_id="p").json()["task_id"]
        claim = worker.claim(parent).json()
        worker.stage(claim, round_number)
        barrier = threading.Barrier(2)

        def commit(barrier=barrier, claim=claim, result=round_number):
            barrier.wait(10)
            return worker.commit(claim, result)

        def create(barrier=barrier, parent=parent):
            barrier.wait(10)
            return operator.create(node_id="c", depends_on=[parent]).json()["task_id"]

        (t1, b1), (t2, b2) = run_in_thread(commit), run_in_thread(create)
        t1.join(30)
        t2.join(30)
        assert b1["value"].status_code == 200
        assert Task.objects.get(pk=b2["value"]).state == "READY", f"round {round_number}"
