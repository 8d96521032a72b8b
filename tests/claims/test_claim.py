"""Claiming (claim-v1.md §4): one winner, the contract's refusals in order, and claim-next without a herd."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from claims.models import Attempt, Task, TaskEvent
from claims.services import token_issue
from tests.support.actors import make_actor
from tests.support.races import Pause, run_in_thread


def test_a_ready_task_is_claimed_with_a_new_attempt_and_generation_1(worker_a, ready_task):
    response = worker_a.claim(ready_task)

    assert response.status_code == 200
    body = response.json()
    assert body["outcome"] == "CLAIMED"
    assert body["claim_generation"] == 1 and body["scheduler_epoch"] == 1 and body["fences"] == {}
    task = Task.objects.get(pk=ready_task)
    assert (task.state, task.owner_id, str(task.attempt_id)) == ("CLAIMED", "worker-a", body["attempt_id"])
    assert task.state_version == 2
    attempt = Attempt.objects.get(pk=body["attempt_id"])
    assert (attempt.claim_generation, attempt.scheduler_epoch, attempt.ended_at) == (1, 1, None)


def test_a_live_lease_is_not_claimable(worker_a, worker_b, ready_task):
    worker_a.claim(ready_task)

    response = worker_b.claim(ready_task)

    assert response.status_code == 409
    assert (response.json()["outcome"], response.json()["reason"]) == ("NOT_CLAIMABLE", "LEASE_LIVE")
    assert response.json()["current"]["claim_generation"] == 1
    assert Task.objects.get(pk=ready_task).owner_id == "worker-a"


def test_an_expired_lease_is_reclaimed_and_the_old_attempt_ends(worker_a, worker_b, ready_task, db_clock):
    first = worker_a.claim(ready_task, ttl=5).json()
    db_clock.travel(6)

    response = worker_b.claim(ready_task)

    assert response.status_code == 200 and response.json()["claim_generation"] == 2
    assert Attempt.objects.get(pk=first["attempt_id"]).end_reason == "RECLAIMED"
    assert list(TaskEvent.objects.filter(task_id=ready_task).values_list("kind", flat=True)) == [
        "task_created",
        "claimed",
        "reclaimed",
    ]


def test_a_committed_task_is_not_claimable(worker_a, worker_b, ready_task):
    claim = worker_a.claim(ready_task).json()
    worker_a.finish(claim, {"ok": True})

    response = worker_b.claim(ready_task)

    assert response.status_code == 409
    assert (response.json()["outcome"], response.json()["reason"]) == ("NOT_CLAIMABLE", "STATE")


def test_a_claim_with_an_old_epoch_is_fenced_before_anything_else(worker_a, ready_task, oncall):
    oncall.post("/namespaces/default/fence", {"reason": "drill"})

    response = worker_a.claim(ready_task, epoch=1)

    assert response.status_code == 409
    assert (response.json()["outcome"], response.json()["reason"]) == ("FENCED", "EPOCH")
    assert response.json()["current"]["scheduler_epoch"] == 2


def test_paused_claims_are_refused_with_the_current_epoch(worker_a, ready_task, oncall):
    oncall.post("/namespaces/default/fence", {"reason": "drill"})

    response = worker_a.claim(ready_task, epoch=2)

    assert response.status_code == 409 and response.json()["outcome"] == "CLAIMS_PAUSED"
    assert Task.objects.get(pk=ready_task).state == "READY"


def test_the_fence_ends_a_claim_so_the_task_is_claimable_again(worker_a, worker_b, ready_task, oncall):
    first = worker_a.claim(ready_task).json()
    oncall.post("/namespaces/default/fence", {"reason": "rollback"})
    oncall.post("/namespaces/default/resume", {})

    response = worker_b.claim(ready_task, epoch=2)

    assert response.status_code == 200
    assert response.json()["claim_generation"] == 2 and response.json()["scheduler_epoch"] == 2
    assert Attempt.objects.get(pk=first["attempt_id"]).end_reason == "FENCED"


def test_a4_two_candidates_read_one_state_version_and_the_second_gets_version_mismatch(
    worker_a, worker_b, ready_task
):
    seen_by_a = worker_a.get(f"/tasks/{ready_task}").json()["state_version"]
    seen_by_b = worker_b.get(f"/tasks/{ready_task}").json()["state_version"]
    assert seen_by_a == seen_by_b
    assert worker_a.claim(ready_task, expected_state_version=seen_by_a).status_code == 200
    before = Task.objects.values().get(pk=ready_task)
    attempts = Attempt.objects.count()

    response = worker_b.claim(ready_task, expected_state_version=seen_by_b)

    assert response.status_code == 409 and response.json()["outcome"] == "VERSION_MISMATCH"
    assert response.json()["current"]["state_version"] == seen_by_a + 1
    assert Task.objects.values().get(pk=ready_task) == before  # nothing changed
    assert Attempt.objects.count() == attempts


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a4_both_candidates_past_the_read_and_only_one_compare_and_set_lands(ready_task):
    """Both claim transactions read state_version N and are paused there; the first is let go and commits,
    then the second: its compare-and-set matches nothing, it re-reads, and answers VERSION_MISMATCH."""
    a, b = make_actor("cand-a", "worker"), make_actor("cand-b", "worker")
    version = Task.objects.get(pk=ready_task).state_version
    pause = Pause("task_claim.read", times=2)
    first_read, second_read = threading.Event(), threading.Event()
    order: list[str] = []

    def claim(actor, marker):
        response = actor.claim(ready_task, expected_state_version=version)
        order.append(actor.name)
        return response

    thread_a, box_a = run_in_thread(lambda: claim(a, first_read))
    pause.wait_reached()
    thread_b, box_b = run_in_thread(lambda: claim(b, second_read))
    pause.resume()
    thread_a.join(30)
    thread_b.join(30)

    responses = {a.name: box_a["value"], b.name: box_b["value"]}
    statuses = sorted(r.status_code for r in responses.values())
    assert statuses == [200, 409]
    loser = next(r for r in responses.values() if r.status_code == 409)
    assert loser.json()["outcome"] in {"VERSION_MISMATCH", "NOT_CLAIMABLE"}
    task = Task.objects.get(pk=ready_task)
    assert task.claim_generation == 1 and task.state_version == version + 1
    assert Attempt.objects.filter(task_id=ready_task).count() == 1


def _race(task_id: str, claimers: list, epoch: int = 1) -> list[int]:
    barrier = threading.Barrier(len(claimers))

    def one(actor):
        barrier.wait(30)
        # A lease long enough to outlast the slowest of 100 threads on two CPUs: a claimer whose clock reading
        # comes after the winner's lease ran out would rightly reclaim.
        return actor.claim(task_id, epoch=epoch, ttl=120).status_code

    threads = [run_in_thread(lambda actor=actor: one(actor)) for actor in claimers]
    for thread, _ in threads:
        thread.join(60)
    errors = [box["error"] for _, box in threads if "error" in box]
    assert not errors, errors
    return [box["value"] for _, box in threads]


def _available_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('max_connections')::int - (SELECT count(*) FROM pg_stat_activity)"
        )
        return cursor.fetchone()[0]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("claimers", [20, 100])
def test_a1_n_claimers_race_for_one_task_and_exactly_one_wins_each_round(claimers, operator, db_clock):
    if claimers + 5 > _available_connections():
        pytest.skip(
            f"{claimers} claimers need {claimers + 5} free PostgreSQL connections "
            f"(have {_available_connections()}); .ci/run raises max_connections"
        )
    actors = [make_actor(f"racer-{i}", "worker") for i in range(claimers)]
    task_id = operator.create(node_id="contended").json()["task_id"]

    for round_number in range(1, 6):
        statuses = _race(task_id, actors)
        assert statuses.count(200) == 1, f"round {round_number}: {statuses.count(200)} winners"
        assert statuses.count(409) == claimers - 1
        task = Task.objects.get(pk=task_id)
        assert task.claim_generation == round_number  # +1 per round, never more
        assert Attempt.objects.filter(task_id=task_id).count() == round_number
        assert Attempt.objects.filter(task_id=task_id, ended_at__isnull=True).count() == 1
        db_clock.travel(121)  # the winner's lease runs out; the next round is a reclaim


@pytest.mark.django_db(transaction=True)
def test_a1_on_the_embedded_database_twenty_claimers_give_one_winner(operator, db_clock):
    """The same race on whichever database runs the suite (SQLite serialises with BEGIN IMMEDIATE)."""
    actors = [make_actor(f"racer-{i}", "worker") for i in range(20)]
    task_id = operator.create(node_id="contended").json()["task_id"]
    for round_number in range(1, 6):
        statuses = _race(task_id, actors)
        assert statuses.count(200) == 1
        assert Task.objects.get(pk=task_id).claim_generation == round_number
        db_clock.travel(121)


def test_claim_next_takes_the_oldest_ready_task(worker_a, operator):
    first = operator.create(node_id="n").json()["task_id"]
    operator.create(node_id="n")

    response = worker_a.claim_next()

    assert response.status_code == 200 and response.json()["task_id"] == first


def test_claim_next_answers_204_with_no_body_when_nothing_is_claimable(worker_a, default_namespace):
    response = worker_a.claim_next()

    assert response.status_code == 204 and response.content == b""


def test_claim_next_filters_by_node_and_reclaims_expired_leases(worker_a, worker_b, operator, db_clock):
    other = operator.create(node_id="other").json()["task_id"]
    wanted = operator.create(node_id="wanted").json()["task_id"]
    assert worker_a.claim_next(node_ids=["wanted"], ttl=5).json()["task_id"] == wanted
    assert worker_b.claim_next(node_ids=["wanted"]).status_code == 204
    db_clock.travel(6)

    response = worker_b.claim_next(node_ids=["wanted"])

    assert response.json()["task_id"] == wanted and response.json()["claim_generation"] == 2
    assert Task.objects.get(pk=other).state == "READY"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_claim_next_callers_never_receive_the_same_task(operator):
    tasks = [operator.create(node_id="batch").json()["task_id"] for _ in range(40)]
    workers = [make_actor(f"puller-{i}", "worker") for i in range(16)]
    barrier = threading.Barrier(len(workers))

    def pull(actor):
        barrier.wait(30)
        got = []
        while True:
            response = actor.claim_next(ttl=60)
            if response.status_code == 204:
                return got
            assert response.status_code == 200, response.content
            got.append(response.json()["task_id"])

    threads = [run_in_thread(lambda actor=actor: pull(actor)) for actor in workers]
    for thread, _ in threads:
        thread.join(60)
    claimed = [task for _, box in threads for task in box["value"]]
    assert sorted(claimed) == sorted(tasks)  # every task once, none twice
    assert Attempt.objects.count() == 40


def test_a_worker_may_not_claim_as_another_owner(worker_a, ready_task):
    response = worker_a.post(
        f"/tasks/{ready_task}/claim", {"owner_id": "worker-b", "scheduler_epoch": 1, "ttl_seconds": 30}
    )

    assert response.status_code == 403
    assert Task.objects.get(pk=ready_task).state == "READY"


def test_a_rejected_claim_changes_nothing_but_is_logged_as_a_fenced_event(worker_a, worker_b, ready_task):
    worker_a.claim(ready_task)
    before = Task.objects.values().get(pk=ready_task)

    worker_b.claim(ready_task)

    assert Task.objects.values().get(pk=ready_task) == before
    fenced = TaskEvent.objects.get(task_id=ready_task, kind="fenced")
    assert (fenced.point, fenced.via, fenced.owner_id) == ("claim", "", "worker-b")
    assert fenced.detail == {"outcome": "NOT_CLAIMABLE", "reason": "LEASE_LIVE"}


def test_tokens_are_stored_only_as_hashes(db):
    issued = token_issue(name="hash-check", role="worker")
    from claims.models import Token

    stored = Token.objects.get(principal__name="hash-check")
    assert issued.token not in (stored.key_hash, stored.prefix)
    assert len(stored.key_hash) == 64
