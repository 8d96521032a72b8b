"""Renew and release (claim-v1.md §4), and A2 / A7: a late worker never disturbs its replacement."""

from __future__ import annotations

import pytest

from claims.models import Attempt, StagedResult, Task, TaskEvent


def test_renew_extends_from_server_now(worker_a, ready_task, db_clock):
    claim = worker_a.claim(ready_task, ttl=10).json()
    db_clock.travel(8)

    response = worker_a.renew(claim, extend=60)

    assert response.status_code == 200 and response.json()["outcome"] == "RENEWED"
    lease = Task.objects.get(pk=ready_task).lease_expires_at
    now = db_clock.now()
    assert 59 <= (lease - now).total_seconds() <= 60


@pytest.mark.parametrize("seconds", [0, 301, -5])
def test_lease_bounds_are_enforced_with_a_400_and_nothing_changes(worker_a, ready_task, seconds):
    claim = worker_a.claim(ready_task).json()
    before = Task.objects.values().get(pk=ready_task)

    renew = worker_a.renew(claim, extend=seconds)
    claim_again = worker_a.claim(ready_task, ttl=seconds)

    assert renew.status_code == 400 and "extend_seconds" in renew.json()["errors"]
    assert claim_again.status_code == 400 and "ttl_seconds" in claim_again.json()["errors"]
    assert Task.objects.values().get(pk=ready_task) == before


def test_an_expired_lease_is_not_revived_by_renew(worker_a, ready_task, db_clock):
    claim = worker_a.claim(ready_task, ttl=5).json()
    db_clock.travel(5)

    response = worker_a.renew(claim)

    assert response.status_code == 409 and response.json()["outcome"] == "EXPIRED"


def test_renew_after_cancel_answers_cancelled_first(worker_a, ready_task, operator, oncall):
    claim = worker_a.claim(ready_task).json()
    operator.post(f"/tasks/{ready_task}/cancel", {"reason": "not needed"})
    oncall.post("/namespaces/default/fence", {"reason": "drill"})

    response = worker_a.renew(claim)

    assert response.status_code == 409 and response.json()["outcome"] == "CANCELLED"


def test_a2_a_late_commit_after_takeover_is_fenced_by_generation(worker_a, worker_b, ready_task, db_clock):
    claim_a = worker_a.claim(ready_task, ttl=5).json()
    assert worker_a.stage(claim_a, {"by": "a"}).status_code == 201
    db_clock.travel(6)  # A's lease expires while A is paused
    claim_b = worker_b.claim(ready_task).json()

    late = worker_a.commit(claim_a, {"by": "a"})
    on_time = worker_b.finish(claim_b, {"by": "b"})

    assert late.status_code == 409
    assert (late.json()["outcome"], late.json()["reason"]) == ("FENCED", "GENERATION")
    assert late.json()["current"]["claim_generation"] == 2
    assert on_time.status_code == 200
    task = Task.objects.get(pk=ready_task)
    assert (task.state, task.result, task.claim_generation) == ("COMMITTED", {"by": "b"}, 2)
    assert StagedResult.objects.filter(task_id=ready_task, canonical=True).count() == 1
    assert claim_b["claim_generation"] > claim_a["claim_generation"]


def test_a_commit_after_ones_own_lease_ran_out_is_fenced_lease_expired(worker_a, ready_task, db_clock):
    claim = worker_a.claim(ready_task, ttl=5).json()
    worker_a.stage(claim, {"v": 1})
    db_clock.travel(5)

    response = worker_a.commit(claim, {"v": 1})

    assert (response.json()["outcome"], response.json()["reason"]) == ("FENCED", "LEASE_EXPIRED")
    assert Task.objects.get(pk=ready_task).state == "CLAIMED"


def test_a7_a_stale_worker_renewing_after_replacement_leaves_the_new_claim_intact(
    worker_a, worker_b, ready_task, db_clock
):
    claim_a = worker_a.claim(ready_task, ttl=5).json()
    db_clock.travel(6)
    claim_b = worker_b.claim(ready_task, ttl=30).json()
    before = Task.objects.values().get(pk=ready_task)

    response = worker_a.renew(claim_a, extend=300)

    assert (response.json()["outcome"], response.json()["reason"]) == ("FENCED", "GENERATION")
    assert Task.objects.values().get(pk=ready_task) == before
    assert str(Task.objects.get(pk=ready_task).attempt_id) == claim_b["attempt_id"]


def test_a7_a_stale_worker_releasing_after_replacement_leaves_the_new_claim_intact(
    worker_a, worker_b, ready_task, db_clock
):
    claim_a = worker_a.claim(ready_task, ttl=5).json()
    db_clock.travel(6)
    claim_b = worker_b.claim(ready_task).json()

    response = worker_a.release(claim_a)

    assert response.status_code == 409 and response.json()["outcome"] == "FENCED"
    task = Task.objects.get(pk=ready_task)
    assert (task.state, task.owner_id, str(task.attempt_id)) == ("CLAIMED", "worker-b", claim_b["attempt_id"])
    assert Attempt.objects.get(pk=claim_b["attempt_id"]).ended_at is None


def test_a7_a_stale_worker_resending_the_current_generation_is_fenced_by_attempt(
    worker_a, worker_b, ready_task, db_clock
):
    claim_a = worker_a.claim(ready_task, ttl=5).json()
    db_clock.travel(6)
    worker_b.claim(ready_task)

    response = worker_a.release(claim_a, claim_generation=2)

    assert (response.json()["outcome"], response.json()["reason"]) == ("FENCED", "ATTEMPT")
    assert Task.objects.get(pk=ready_task).owner_id == "worker-b"


def test_release_returns_the_task_to_ready_and_its_staged_result_can_no_longer_commit(worker_a, ready_task):
    claim = worker_a.claim(ready_task).json()
    worker_a.stage(claim, {"partial": True})

    released = worker_a.release(claim)
    commit = worker_a.commit(claim, {"partial": True})

    assert released.status_code == 200 and released.json() == {"outcome": "RELEASED"}
    assert (commit.json()["outcome"], commit.json()["reason"]) == ("FENCED", "ATTEMPT")
    task = Task.objects.get(pk=ready_task)
    assert (task.state, task.attempt_id, task.owner_id) == ("READY", None, None)
    assert Attempt.objects.get(pk=claim["attempt_id"]).end_reason == "RELEASED"


def test_releasing_after_ones_own_lease_expired_is_allowed_when_nobody_took_over(
    worker_a, ready_task, db_clock
):
    claim = worker_a.claim(ready_task, ttl=5).json()
    db_clock.travel(10)

    response = worker_a.release(claim)

    assert response.status_code == 200
    assert Task.objects.get(pk=ready_task).state == "READY"


def test_a_worker_cannot_renew_or_release_another_workers_attempt(worker_a, worker_b, ready_task):
    claim_a = worker_a.claim(ready_task).json()

    as_self = worker_b.renew(claim_a, owner_id="worker-b")
    as_other = worker_b.renew(claim_a)  # owner_id worker-a: not who worker_b is
    release = worker_b.release(claim_a, owner_id="worker-b")

    assert (as_self.status_code, as_other.status_code, release.status_code) == (403, 403, 403)
    assert Task.objects.get(pk=ready_task).owner_id == "worker-a"
    assert not TaskEvent.objects.filter(
        task_id=ready_task, kind="fenced"
    ).exists()  # 403s are not protocol rejections
