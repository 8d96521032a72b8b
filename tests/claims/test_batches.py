"""claim-v1.md §9 through the API: commit with the result inline, batch claims, and batch commits judged item by
item. The records asserted are the rows: staged results, attempts, the task's state."""

from __future__ import annotations

import threading

import pytest

from claims.models import Attempt, StagedResult, Task

RESULT = {"answer": 42}


# --- inline commit ------------------------------------------------------------------------------------------


def test_an_inline_commit_stages_and_commits_in_one_request(worker_a, ready_task):
    claim = worker_a.claim(ready_task).json()

    answer = worker_a.commit_inline(claim, RESULT)

    assert answer.status_code == 200, answer.json()
    body = answer.json()
    staged = StagedResult.objects.get(task_id=ready_task)
    assert body["outcome"] == "COMMITTED" and body["staged_result_id"] == str(staged.pk)
    assert staged.canonical and staged.result == RESULT
    assert Task.objects.get(pk=ready_task).state == "COMMITTED"
    repeat = worker_a.commit_inline(claim, RESULT)  # the stored answer, nothing new
    assert repeat.status_code == 200 and repeat.json() == body
    assert StagedResult.objects.filter(task_id=ready_task).count() == 1


def test_an_inline_commit_reuses_the_row_this_attempt_staged_with_the_same_digest(worker_a, ready_task):
    claim = worker_a.claim(ready_task).json()
    staged_id = worker_a.stage(claim, RESULT).json()["staged_result_id"]

    answer = worker_a.commit_inline(claim, RESULT)

    assert answer.status_code == 200 and answer.json()["staged_result_id"] == staged_id
    assert StagedResult.objects.filter(task_id=ready_task).count() == 1


def test_a_refused_inline_commit_stages_nothing(worker_a, worker_b, ready_task, db_clock):
    late = worker_a.claim(ready_task, ttl=5).json()
    db_clock.travel(6)
    worker_b.claim(ready_task)  # the lease ran out: B reclaims

    fenced = worker_a.commit_inline(late, RESULT)

    assert fenced.status_code == 409 and fenced.json()["outcome"] == "FENCED"
    assert not StagedResult.objects.filter(attempt_id=late["attempt_id"]).exists()
    assert Task.objects.get(pk=ready_task).state == "CLAIMED"


def test_an_inline_commit_on_revised_input_is_stale_and_stages_nothing(worker_a, ready_task, operator):
    claim = worker_a.claim(ready_task).json()
    operator.post(f"/tasks/{ready_task}/input", {"input": {"source": "revised"}})

    answer = worker_a.commit_inline(claim, RESULT)

    assert answer.status_code == 409 and answer.json()["outcome"] == "STALE_INPUT"
    assert not StagedResult.objects.filter(task_id=ready_task).exists()


def test_an_inline_result_that_is_not_its_digest_is_a_400_and_changes_nothing(worker_a, ready_task):
    claim = worker_a.claim(ready_task).json()

    body = worker_a.commit_body(claim, RESULT, inline=True) | {"result": {"answer": 41}}
    answer = worker_a.post(f"/tasks/{ready_task}/commit", body)

    assert answer.status_code == 400 and "result_digest" in answer.json()["errors"]
    assert not StagedResult.objects.filter(task_id=ready_task).exists()
    assert Task.objects.get(pk=ready_task).state == "CLAIMED"


# --- batch claims -------------------------------------------------------------------------------------------


def test_a_batch_claims_what_is_claimable_each_with_its_own_attempt(worker_a, operator):
    tasks = [operator.create(node_id=f"n{i}").json()["task_id"] for i in range(3)]

    answer = worker_a.claim_batch(5)

    assert answer.status_code == 200, answer.json()
    claims = answer.json()["claims"]
    assert answer.json()["outcome"] == "CLAIMED" and sorted(c["task_id"] for c in claims) == sorted(tasks)
    for claim in claims:
        assert set(claim) >= {"attempt_id", "claim_generation", "lease_expires_at", "fences", "input"}
        assert Task.objects.get(pk=claim["task_id"]).attempt_id.hex == claim["attempt_id"].replace("-", "")
    assert Attempt.objects.filter(task_id__in=tasks).count() == 3
    assert worker_a.claim_batch(5).status_code == 204


@pytest.mark.parametrize("max_tasks", [0, 101, "10", None])
def test_a_batch_outside_1_to_100_is_a_400(worker_a, operator, max_tasks):
    operator.create()

    answer = worker_a.claim_batch(max_tasks)

    assert answer.status_code == 400 and "max_tasks" in answer.json()["errors"]
    assert not Attempt.objects.exists()


def test_a_batch_with_an_old_epoch_is_fenced_and_claims_nothing(worker_a, operator):
    operator.create()

    answer = worker_a.claim_batch(3, epoch=7)

    assert answer.status_code == 409 and answer.json()["outcome"] == "FENCED"
    assert not Attempt.objects.exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_batches_never_share_a_task(operator):
    from tests.support.actors import make_actor
    from tests.support.races import run_in_thread

    tasks = {operator.create(node_id=f"n{i}").json()["task_id"] for i in range(60)}
    workers = [make_actor(f"batcher-{i}", "worker") for i in range(8)]
    start = threading.Barrier(len(workers))

    def batch(worker):
        def go():
            start.wait(10)
            got = []
            while True:
                answer = worker.claim_batch(10)
                if answer.status_code == 204:
                    return got
                assert answer.status_code == 200, answer.content
                got += [c["task_id"] for c in answer.json()["claims"]]

        return go

    runs = [run_in_thread(batch(w)) for w in workers]
    for thread, _ in runs:
        thread.join(60)
    handed = [task for _, box in runs for task in box["value"]]

    assert len(handed) == len(set(handed)) == 60 and set(handed) == tasks
    assert Attempt.objects.filter(task_id__in=tasks).count() == 60


# --- batch commits ------------------------------------------------------------------------------------------


def test_a_batch_commit_judges_each_item_on_its_own_and_writes_only_the_good(
    worker_a, worker_b, operator, db_clock
):
    ids = [operator.create(node_id=f"n{i}").json()["task_id"] for i in range(5)]
    good, fenced, stale, foreign = (
        worker_a.claim(t, ttl=5 if i == 1 else 30).json() for i, t in enumerate(ids[:4])
    )
    b_claim = worker_b.claim(ids[4]).json()
    db_clock.travel(6)
    worker_b.claim(ids[1])  # the lease of `fenced` ran out: B reclaims it
    operator.post(f"/tasks/{ids[2]}/input", {"input": {"revised": True}})
    items = [
        {"task_id": ids[0], **worker_a.commit_body(good, RESULT, inline=True)},
        {"task_id": ids[1], **worker_a.commit_body(fenced, RESULT, inline=True)},
        {"task_id": ids[2], **worker_a.commit_body(stale, RESULT, inline=True)},
        {"task_id": ids[4], **worker_a.commit_body(b_claim, RESULT, inline=True)},  # B's attempt
        {"task_id": "no-such-task", **worker_a.commit_body(good, RESULT)},
        {"task_id": ids[3], **worker_a.commit_body(foreign, RESULT), "result_digest": "nope"},
    ]

    answer = worker_a.commits(items)

    assert answer.status_code == 200, answer.json()
    results = answer.json()["results"]
    assert [r["task_id"] for r in results] == [ids[0], ids[1], ids[2], ids[4], "no-such-task", ids[3]]
    assert [r["status"] for r in results] == [200, 409, 409, 403, 404, 400]
    assert results[0]["body"]["outcome"] == "COMMITTED"
    assert [results[1]["body"]["outcome"], results[2]["body"]["outcome"]] == ["FENCED", "STALE_INPUT"]
    assert [Task.objects.get(pk=t).state for t in ids] == [
        "COMMITTED",
        "CLAIMED",
        "CLAIMED",
        "CLAIMED",
        "CLAIMED",
    ]
    assert list(StagedResult.objects.values_list("task_id", flat=True)) == [ids[0]]


@pytest.mark.parametrize("bad", [None, 7, "text", [], [{"task_id": "x"}], True])
def test_an_item_that_is_not_a_commit_is_that_items_400_and_the_others_commit(worker_a, ready_task, bad):
    """Issue 21, 6: a ``null`` item failed the whole envelope while other bad items were per-item 400s."""
    claim = worker_a.claim(ready_task).json()

    answer = worker_a.commits(
        [bad, {"task_id": ready_task, **worker_a.commit_body(claim, RESULT, inline=True)}]
    )

    assert answer.status_code == 200, answer.json()
    results = answer.json()["results"]
    assert [r["status"] for r in results] == [400, 200]
    assert results[0]["task_id"] == "" and results[0]["body"]["outcome"] == "INVALID"
    assert Task.objects.get(pk=ready_task).state == "COMMITTED"


@pytest.mark.parametrize("envelope", [{"commits": {}}, {"commits": []}, {"commits": [{}] * 101}, {}, []])
def test_a_malformed_commits_envelope_is_a_400_for_the_whole_request(worker_a, ready_task, envelope):
    claim = worker_a.claim(ready_task).json()
    worker_a.stage(claim, RESULT)

    answer = worker_a.post("/commits", envelope)

    assert answer.status_code == 400 and answer.json()["outcome"] == "INVALID"
    assert Task.objects.get(pk=ready_task).state == "CLAIMED"


def test_a_batch_tops_up_its_ready_picks_with_expired_leases(worker_a, worker_b, operator, db_clock):
    tasks = [operator.create(node_id=f"n{i}").json()["task_id"] for i in range(3)]
    worker_b.claim(tasks[0], ttl=5)
    db_clock.travel(6)  # B's lease ran out

    answer = worker_a.claim_batch(5)

    assert answer.status_code == 200, answer.json()
    claims = {c["task_id"]: c for c in answer.json()["claims"]}
    assert sorted(claims) == sorted(tasks)
    assert claims[tasks[0]]["claim_generation"] == 2  # the reclaim: a new generation
    assert [Task.objects.get(pk=t).owner_id for t in tasks] == ["worker-a"] * 3
    assert Attempt.objects.filter(task_id=tasks[0]).count() == 2
