"""Issue 21 — the other half of the promise: a healthy worker makes progress. A batch never answers 204 while a
task it may take remains, it takes at most one task per resource key, and an attempt's start and lease come from
the clock its grant was decided on (so no record ever shows two holders of one key). Asserted on the rows."""

from __future__ import annotations

import pytest

from claims import clock
from claims.models import Attempt, Task
from tests.support.races import row_locked, run_in_thread, wait_for_lock_waiters


def _resource(operator, key: str) -> None:
    assert operator.post("/resources", {"resource_key": key}).status_code == 201


def test_a_batch_takes_the_oldest_task_of_a_shared_key_and_every_free_one(worker_a, operator):
    """10 READY tasks list one free key, 5 list none; the batch answered 204 (issue 21, 1)."""
    _resource(operator, "k")
    sharing = [operator.create(node_id=f"s{i}", resources=["k"]).json()["task_id"] for i in range(10)]
    free = [operator.create(node_id=f"f{i}").json()["task_id"] for i in range(5)]

    answer = worker_a.claim_batch(20)

    assert answer.status_code == 200, answer.content
    claimed = {c["task_id"] for c in answer.json()["claims"]}
    assert claimed == {sharing[0], *free}
    assert set(Task.objects.filter(state="CLAIMED").values_list("task_id", flat=True)) == claimed
    assert Task.objects.filter(state="READY").count() == 9
    assert Attempt.objects.count() == 6
    assert worker_a.claim_batch(20).status_code == 204  # the key is held: nothing more is claimable


def test_a_batch_takes_one_task_per_key_over_several_keys(worker_a, operator):
    for key in ("a", "b"):
        _resource(operator, key)
    ab = operator.create(node_id="ab", resources=["a", "b"]).json()["task_id"]
    a = operator.create(node_id="a", resources=["a"]).json()["task_id"]
    b = operator.create(node_id="b", resources=["b"]).json()["task_id"]

    answer = worker_a.claim_batch(3)

    assert answer.status_code == 200, answer.content
    assert [c["task_id"] for c in answer.json()["claims"]] == [ab]
    assert set(Task.objects.filter(state="READY").values_list("task_id", flat=True)) == {a, b}


def test_a_batch_passes_over_a_key_held_by_another_task_and_takes_the_rest(worker_a, worker_b, operator):
    _resource(operator, "k")
    holder = operator.create(node_id="h", resources=["k"]).json()["task_id"]
    assert worker_b.claim(holder).status_code == 200
    waiting = [operator.create(node_id=f"w{i}", resources=["k"]).json()["task_id"] for i in range(9)]
    free = operator.create(node_id="free").json()["task_id"]

    answer = worker_a.claim_batch(20)

    assert answer.status_code == 200, answer.content
    assert [c["task_id"] for c in answer.json()["claims"]] == [free]
    assert Task.objects.filter(task_id__in=waiting, state="READY").count() == 9


def test_a_batch_takes_a_key_whose_holder_expired_and_only_one_task_of_it(
    worker_a, worker_b, operator, db_clock
):
    _resource(operator, "k")
    holder = operator.create(node_id="h", resources=["k"]).json()["task_id"]
    assert worker_b.claim(holder, ttl=5).status_code == 200
    others = [operator.create(node_id=f"w{i}", resources=["k"]).json()["task_id"] for i in range(3)]
    db_clock.travel(6)

    answer = worker_a.claim_batch(10)

    assert answer.status_code == 200, answer.content
    claimed = [c["task_id"] for c in answer.json()["claims"]]
    assert len(claimed) == 1 and claimed[0] in [holder, *others]
    holders = Task.objects.filter(state="CLAIMED", owner_id="worker-a")
    assert holders.count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["claim", "claim_next", "claim_batch"])
def test_a_grant_that_waited_for_a_key_starts_on_the_clock_it_was_decided_on(
    worker_a, worker_b, operator, how
):
    """H holds key k; T lists k. T's claim waits on k's lock (held by the test) while H's lease runs out; its
    holder check reads the clock after the lock, so H is judged expired — and T's attempt must start, and its
    lease run, from that same clock: not from the namespace hold's earlier one, which lies inside H's lease."""
    _resource(operator, "k")
    holder = operator.create(node_id="h", resources=["k"]).json()["task_id"]
    assert worker_b.claim(holder, ttl=5).status_code == 200
    task = operator.create(node_id="t", resources=["k"]).json()["task_id"]
    h_lease = Task.objects.get(pk=holder).lease_expires_at

    call = {
        "claim": lambda: worker_a.claim(task, ttl=30),
        "claim_next": lambda: worker_a.claim_next(ttl=30, node_ids=["t"]),
        "claim_batch": lambda: worker_a.claim_batch(5, ttl=30, node_ids=["t"]),
    }[how]
    with row_locked("SELECT 1 FROM claims_resourcekey WHERE resource_key = %s FOR UPDATE", ["k"]):
        thread, box = run_in_thread(call)
        wait_for_lock_waiters(1)
        clock.travel(6)  # H's lease runs out while T's claim waits for the key
    thread.join(20)
    assert box["value"].status_code == 200, box["value"].content

    attempt = Attempt.objects.get(task_id=task)
    row = Task.objects.get(pk=task)
    assert attempt.started_at >= h_lease, (attempt.started_at, h_lease)
    assert (row.lease_expires_at - attempt.started_at).total_seconds() == 30
