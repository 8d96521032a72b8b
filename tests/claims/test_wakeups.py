"""Issue 21 — wake-ups that never strand a claimable task (claim-v1.md §9 ``wait_seconds``), on PostgreSQL through
the API: a wake-up reaches a waiter the task suits, whatever the order the waiters queued in; a woken waiter that
cannot use it hands it on; freeing a resource key wakes the waiters of the tasks that list it; a waiting claim
re-checks its token on every retry; a waiter with nothing to take does not spin. Each was seen failing first."""

from __future__ import annotations

import time

import pytest

from claims import interleave
from claims.models import Attempt, Task, Token
from claims.services import token_revoke
from claims.waiting import hub
from tests.support.actors import make_actor
from tests.support.races import run_in_thread

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

BOUND = 2.0  # seconds from the change to the answer; each wait below is 20 s, so a missed wake-up fails it


def _waiting(worker, **body):
    """A waiting claim-next on its own connection; returns once the hub holds it (it tried and queued)."""
    before = hub.waiting()
    thread, box = run_in_thread(lambda: (worker.claim_next(**body), time.monotonic()))
    deadline = time.monotonic() + 10
    while hub.waiting() < before + 1 and time.monotonic() < deadline and not box:
        time.sleep(0.01)
    assert hub.waiting() >= before + 1, box
    return thread, box


def _answer(thread, box):
    thread.join(40)
    assert "error" not in box, box
    return box["value"]


def _end_waits(oncall, waits) -> None:
    oncall.post("/namespaces/default/fence", {"reason": "end the test's waits"})
    for thread, _ in waits:
        thread.join(40)


def _resource(operator, key: str) -> None:
    assert operator.post("/resources", {"resource_key": key}).status_code == 201


def test_a_task_wakes_a_waiter_it_suits_whatever_the_queue_order(operator, oncall):
    """Four waiters for node x queue before two for node y; a new y task went unclaimed until a y waiter's own
    wait ran out (issue 21, 2)."""
    xs = [_waiting(make_actor(f"x-{i}", "worker"), node_ids=["x"], wait_seconds=20) for i in range(4)]
    ys = [_waiting(make_actor(f"y-{i}", "worker"), node_ids=["y"], wait_seconds=20) for i in range(2)]

    created = time.monotonic()
    task_id = operator.create(node_id="y").json()["task_id"]
    deadline = time.monotonic() + BOUND
    while Task.objects.get(pk=task_id).state == "READY" and time.monotonic() < deadline:
        time.sleep(0.01)
    granted = time.monotonic() - created

    assert Task.objects.get(pk=task_id).owner_id in {"y-0", "y-1"}, granted
    assert granted < BOUND
    _end_waits(oncall, xs + ys)


def test_a_woken_waiter_whose_retry_is_refused_hands_the_wake_up_on(operator, oncall):
    """The oldest waiter is woken, but its token was revoked meanwhile: it answers 401 (issue 21, 4: it used to be
    granted with the principal it authenticated as once) and the task goes to the next waiter (2: it stayed READY
    until that waiter's own wait ran out)."""
    revoked, healthy = make_actor("revoked", "worker"), make_actor("healthy", "worker")
    first = _waiting(revoked, wait_seconds=20)
    second = _waiting(healthy, wait_seconds=20)
    token_revoke(token_id=Token.objects.get(principal__name="revoked").pk)

    created = time.monotonic()
    task_id = operator.create().json()["task_id"]
    answer, _ = _answer(*first)
    got, answered = _answer(*second)

    assert answer.status_code == 401
    assert got.status_code == 200 and got.json()["task_id"] == task_id
    assert answered - created < BOUND
    assert not Attempt.objects.filter(owner_id="revoked").exists()
    assert Task.objects.get(pk=task_id).owner_id == "healthy"
    _end_waits(oncall, [])


@pytest.mark.parametrize("how", ["commit", "release", "cancel", "fence"])
def test_freeing_a_key_wakes_the_waiters_of_tasks_that_list_it(worker_a, worker_b, operator, oncall, how):
    """H holds key k; T lists k; a worker waits for T's node; H's attempt ends. T was granted only when the wait
    ran out (issue 21, 3). Keys are not a namespace's: the fence ends H's claim in its namespace, and T, waiting in
    another, must hear of it."""
    _resource(operator, "k")
    holder = operator.create(node_id="h", resources=["k"]).json()["task_id"]
    claim = worker_b.claim(holder).json()
    namespace = "other" if how == "fence" else "default"
    if how == "fence":
        assert operator.post("/namespaces", {"name": "other"}).status_code == 201
    task_id = operator.create(node_id="t", resources=["k"], namespace=namespace).json()["task_id"]
    thread, box = _waiting(worker_a, node_ids=["t"], wait_seconds=20, namespace=namespace)

    freed = time.monotonic()
    if how == "commit":
        named = worker_b.get("/resources/k").json()
        resources = [{"resource_key": "k", "incarnation": named["incarnation"], "expected_revision": 0}]
        assert worker_b.finish(claim, {"done": True}, resources=resources).status_code == 200
    elif how == "release":
        assert worker_b.release(claim).status_code == 200
    elif how == "cancel":
        assert operator.post(f"/tasks/{holder}/cancel", {"reason": "no longer needed"}).status_code == 200
    else:
        assert oncall.post("/namespaces/default/fence", {"reason": "incident"}).status_code == 200
    answer, answered = _answer(thread, box)

    assert answer.status_code == 200 and answer.json()["task_id"] == task_id, answer.content
    assert answered - freed < BOUND


def test_a_key_whose_holder_expires_wakes_a_waiter_filtered_to_another_node(worker_a, worker_b, operator):
    """Nobody notifies an expiry: the waiter's timer must count the lease of the key's holder, not only the leases
    of its own nodes."""
    _resource(operator, "k")
    holder = operator.create(node_id="h", resources=["k"]).json()["task_id"]
    worker_b.claim(holder, ttl=1)
    expires = time.monotonic() + 1
    task_id = operator.create(node_id="t", resources=["k"]).json()["task_id"]
    thread, box = _waiting(worker_a, node_ids=["t"], wait_seconds=20)

    answer, answered = _answer(thread, box)

    assert answer.status_code == 200 and answer.json()["task_id"] == task_id
    assert answered - expires < BOUND


def test_a_waiter_with_nothing_to_take_does_not_spin_on_an_expired_lease_of_another_node(
    worker_a, worker_b, operator
):
    """One expired, unreclaimed lease of node h; a waiter for node t re-polled every 50 ms (issue 21, 5)."""
    holder = operator.create(node_id="h").json()["task_id"]
    worker_b.claim(holder, ttl=1)
    time.sleep(1.1)
    rounds = []
    interleave.install("claim_wait.found_nothing", lambda: rounds.append(time.monotonic()))

    answer = worker_a.claim_next(node_ids=["t"], wait_seconds=3)

    assert answer.status_code == 204
    assert len(rounds) <= 3, f"{len(rounds)} tries in a 3 s wait"
    assert Task.objects.get(pk=holder).owner_id == "worker-b"  # nobody reclaimed it: not this waiter's node
