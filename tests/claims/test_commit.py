"""Stage and commit (claim-v1.md §5): every check at the commit point, in order; one canonical commit, ever."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from claims.digest import digest
from claims.models import Attempt, StagedResult, Task, TaskEvent
from tests.support.races import Pause, run_in_thread, wait_for_lock_waiters


def test_a14_a_healthy_current_owner_with_current_input_commits(worker_a, ready_task):
    claim = worker_a.claim(ready_task).json()
    staged = worker_a.stage(claim, {"parser": "ok"})

    response = worker_a.commit(claim, {"parser": "ok"})

    assert staged.status_code == 201 and staged.json()["outcome"] == "STAGED"
    assert response.status_code == 200
    body = response.json()
    assert body["outcome"] == "COMMITTED" and body["unblocked"] == []
    task = Task.objects.get(pk=ready_task)
    assert task.state == "COMMITTED" and str(task.result_commit_id) == body["result_commit_id"]
    assert task.result == {"parser": "ok"} and task.result_digest == digest({"parser": "ok"})
    assert Attempt.objects.get(pk=claim["attempt_id"]).end_reason == "COMMITTED"
    assert worker_a.get(f"/tasks/{ready_task}").json()["result"] == {"parser": "ok"}


def test_a_staged_result_is_invisible_until_committed(worker_a, ready_task):
    claim = worker_a.claim(ready_task).json()
    worker_a.stage(claim, {"draft": 1})

    task = worker_a.get(f"/tasks/{ready_task}").json()

    assert task["result"] is None and task["result_digest"] is None and task["state"] == "CLAIMED"


def test_staging_the_same_digest_again_returns_the_same_record(worker_a, ready_task):
    claim = worker_a.claim(ready_task).json()

    first = worker_a.stage(claim, {"x": 1})
    second = worker_a.stage(claim, {"x": 1})

    assert first.status_code == second.status_code == 201
    assert first.json()["staged_result_id"] == second.json()["staged_result_id"]
    assert StagedResult.objects.filter(task_id=ready_task).count() == 1
    assert TaskEvent.objects.filter(task_id=ready_task, kind="result_staged").count() == 1


def test_a_digest_that_does_not_match_its_value_is_a_400(worker_a, ready_task):
    claim = worker_a.claim(ready_task).json()

    response = worker_a.stage(claim, {"x": 1}, result_digest=digest({"x": 2}))

    assert response.status_code == 400 and "result_digest" in response.json()["errors"]
    assert not StagedResult.objects.exists()


def test_a_fenced_attempt_may_still_stage_but_never_commit(worker_a, worker_b, ready_task, db_clock):
    claim_a = worker_a.claim(ready_task, ttl=5).json()
    db_clock.travel(6)
    worker_b.claim(ready_task)

    staged = worker_a.stage(claim_a, {"late": True})
    commit = worker_a.commit(claim_a, {"late": True})

    assert staged.status_code == 201
    assert commit.status_code == 409 and commit.json()["outcome"] == "FENCED"
    assert Task.objects.get(pk=ready_task).result is None


def test_commit_without_a_staged_result_is_not_staged(worker_a, ready_task):
    claim = worker_a.claim(ready_task).json()

    response = worker_a.commit(claim, {"never": "staged"})

    assert response.status_code == 409 and response.json()["outcome"] == "NOT_STAGED"
    assert Task.objects.get(pk=ready_task).state == "CLAIMED"


def test_a_repeat_of_a_successful_commit_returns_the_stored_body_even_after_expiry_and_fence(
    worker_a, ready_task, db_clock, oncall
):
    claim = worker_a.claim(ready_task, ttl=5).json()
    first = worker_a.finish(claim, {"r": 1})
    db_clock.travel(60)
    oncall.post("/namespaces/default/fence", {"reason": "after"})

    again = worker_a.commit(claim, {"r": 1})

    assert again.status_code == 200 and again.json() == first.json()
    assert StagedResult.objects.filter(task_id=ready_task, canonical=True).count() == 1


def test_a_second_commit_with_another_digest_is_fenced_not_a_second_canonical_result(worker_a, ready_task):
    claim = worker_a.claim(ready_task).json()
    worker_a.stage(claim, {"r": 2})
    worker_a.finish(claim, {"r": 1})

    response = worker_a.commit(claim, {"r": 2})

    assert response.status_code == 409 and response.json()["outcome"] == "FENCED"
    assert Task.objects.get(pk=ready_task).result == {"r": 1}


def test_the_database_itself_refuses_a_second_canonical_commit(worker_a, ready_task):
    claim = worker_a.claim(ready_task).json()
    worker_a.stage(claim, {"r": 2})
    worker_a.finish(claim, {"r": 1})
    other = StagedResult.objects.get(task_id=ready_task, canonical=False)

    import uuid

    from django.utils import timezone

    with pytest.raises(IntegrityError), transaction.atomic():
        StagedResult.objects.filter(pk=other.pk).update(
            canonical=True, commit_id=uuid.uuid4(), committed_at=timezone.now(), unblocked=[]
        )


def test_a5_a_commit_on_revised_input_is_stale_until_recomputed_under_the_same_claim(
    worker_a, operator, ready_task
):
    claim = worker_a.claim(ready_task).json()
    worker_a.stage(claim, {"from": "old"})
    revised = operator.post(f"/tasks/{ready_task}/input", {"input": {"source": "grammar-v2.y"}})

    stale = worker_a.commit(claim, {"from": "old"})
    fresh_input = worker_a.get(f"/tasks/{ready_task}").json()
    worker_a.stage(claim, {"from": "new"})
    recomputed = worker_a.commit(claim, {"from": "new"}, input_digest=fresh_input["input_digest"])

    assert revised.status_code == 200 and revised.json()["state_version"] == claim["state_version"] + 1
    assert stale.status_code == 409 and stale.json()["outcome"] == "STALE_INPUT"
    assert stale.json()["current"]["input_digest"] == digest({"source": "grammar-v2.y"})
    assert recomputed.status_code == 200
    task = Task.objects.get(pk=ready_task)
    assert task.result == {"from": "new"} and task.claim_generation == claim["claim_generation"]


def test_the_commit_checks_run_in_the_contracts_order(worker_a, worker_b, ready_task, operator, db_clock):
    """A commit that is cancelled, fenced, stale and unstaged all at once answers CANCELLED; then, one cause
    removed at a time, FENCED, STALE_INPUT, NOT_STAGED."""
    claim = worker_a.claim(ready_task).json()
    operator.post(f"/tasks/{ready_task}/input", {"input": {"changed": True}})
    everything_wrong = {"observed_cancel_generation": 7, "claim_generation": 9}
    assert worker_a.commit(claim, {"x": 1}, **everything_wrong).json()["outcome"] == "CANCELLED"
    assert worker_a.commit(claim, {"x": 1}, claim_generation=9).json()["reason"] == "GENERATION"
    assert worker_a.commit(claim, {"x": 1}).json()["outcome"] == "STALE_INPUT"
    current_digest = Task.objects.get(pk=ready_task).input_digest
    assert worker_a.commit(claim, {"x": 1}, input_digest=current_digest).json()["outcome"] == "NOT_STAGED"
    outcomes = list(
        TaskEvent.objects.filter(task_id=ready_task, kind="fenced").values_list("detail__outcome", flat=True)
    )
    assert outcomes == ["CANCELLED", "FENCED", "STALE_INPUT", "NOT_STAGED"]


def test_a_commit_must_name_exactly_the_tasks_resources(worker_a, ready_task):
    claim = worker_a.claim(ready_task).json()
    worker_a.stage(claim, {"x": 1})
    named = [
        {
            "resource_key": "repo:main",
            "incarnation": "6b1f0b5e-6a7c-4c7e-9d7c-1c2b3a4d5e6f",
            "expected_revision": 0,
        }
    ]

    response = worker_a.commit(claim, {"x": 1}, resources=named)

    assert response.status_code == 400 and "resources" in response.json()["errors"]
    assert Task.objects.get(pk=ready_task).state == "CLAIMED"


def test_a_worker_cannot_commit_another_workers_attempt(worker_a, worker_b, ready_task):
    claim = worker_a.claim(ready_task).json()
    worker_a.stage(claim, {"x": 1})

    commit = worker_b.commit(claim, {"x": 1})
    stage = worker_b.stage(claim, {"y": 1})

    assert commit.status_code == 403 and stage.status_code == 403
    assert Task.objects.get(pk=ready_task).state == "CLAIMED"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a6_commit_first_then_cancel_the_recorded_order_decides(operator, ready_task):
    from tests.support.actors import make_actor

    worker = make_actor("racer", "worker")
    claim = worker.claim(ready_task).json()
    worker.stage(claim, {"done": True})
    pause = Pause("task_commit.checked")

    committing, commit_box = run_in_thread(lambda: worker.commit(claim, {"done": True}))
    pause.wait_reached()  # the commit has checked authority and holds the task row
    cancelling, cancel_box = run_in_thread(
        lambda: operator.post(f"/tasks/{ready_task}/cancel", {"reason": "race"})
    )
    wait_for_lock_waiters(1)  # the cancel has queued behind the commit
    pause.resume()
    committing.join(30)
    cancelling.join(30)

    assert commit_box["value"].status_code == 200
    assert (
        cancel_box["value"].status_code == 409 and cancel_box["value"].json()["outcome"] == "NOT_CANCELLABLE"
    )
    task = Task.objects.get(pk=ready_task)
    assert (task.state, task.cancel_generation) == ("COMMITTED", 0)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a6_cancel_first_then_commit_the_recorded_order_decides(operator, ready_task):
    from tests.support.actors import make_actor

    worker = make_actor("racer", "worker")
    claim = worker.claim(ready_task).json()
    worker.stage(claim, {"done": True})
    pause = Pause("task_cancel.locked")

    cancelling, cancel_box = run_in_thread(
        lambda: operator.post(f"/tasks/{ready_task}/cancel", {"reason": "race"})
    )
    pause.wait_reached()  # the cancel holds the task row
    committing, commit_box = run_in_thread(lambda: worker.commit(claim, {"done": True}))
    wait_for_lock_waiters(1)
    pause.resume()
    cancelling.join(30)
    committing.join(30)

    assert cancel_box["value"].status_code == 200
    assert commit_box["value"].status_code == 409 and commit_box["value"].json()["outcome"] == "CANCELLED"
    task = Task.objects.get(pk=ready_task)
    assert (task.state, task.cancel_generation, task.result) == ("CANCELLED", 1, None)
    assert not StagedResult.objects.filter(canonical=True).exists()
