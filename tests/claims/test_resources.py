"""Protected resources (claim-v1.md §7): tokens scoped to the resource, taken by every claim; incarnations and
revisions checked at commit (A10, A11, A12), and a receiver that enforces tokens in its own database."""

from __future__ import annotations

import pytest
from claim_client.receiver import StaleToken, guard_write, parse_fence_header
from django.db import transaction

from claims.models import Attempt, Resource, ResourceKey, Task
from tests.receiver.models import ReportFence


@pytest.fixture
def repo(operator) -> dict:
    response = operator.post("/resources", {"resource_key": "repo:main"})
    assert response.status_code == 201, response.content
    return response.json()


def _named(resource: dict, revision: int | None = None) -> list[dict]:
    return [
        {
            "resource_key": resource["resource_key"],
            "incarnation": resource["incarnation"],
            "expected_revision": resource["revision"] if revision is None else revision,
        }
    ]


def test_a_resource_is_created_read_deleted_and_recreated_as_a_new_incarnation(operator, worker_a, repo):
    duplicate = operator.post("/resources", {"resource_key": "repo:main"})
    read = worker_a.get("/resources/repo:main")
    deleted = operator.client.delete("/api/v1/resources/repo:main")
    gone = worker_a.get("/resources/repo:main")
    again = operator.post("/resources", {"resource_key": "repo:main"})

    assert set(repo) == {"resource_key", "incarnation", "revision", "fence_token"} and repo["revision"] == 0
    assert duplicate.status_code == 409 and duplicate.json()["outcome"] == "RESOURCE_EXISTS"
    assert read.json()["holder"] is None
    assert deleted.status_code == 204 and gone.status_code == 404
    assert again.status_code == 201 and again.json()["incarnation"] != repo["incarnation"]
    assert again.json()["revision"] == 0
    assert worker_a.client.delete("/api/v1/resources/repo:main").status_code == 403


def test_every_claim_takes_the_resources_next_token_and_the_attempt_keeps_it(
    operator, worker_a, worker_b, repo, db_clock
):
    task_id = operator.create(resources=["repo:main"]).json()["task_id"]

    first = worker_a.claim(task_id, ttl=5).json()
    db_clock.travel(6)
    second = worker_b.claim(task_id).json()

    assert first["fences"] == {"repo:main": 1} and second["fences"] == {"repo:main": 2}
    assert Attempt.objects.get(pk=second["attempt_id"]).fences == {
        "repo:main": {"incarnation": repo["incarnation"], "token": 2}
    }
    holder = worker_a.get("/resources/repo:main").json()["holder"]
    assert holder == {"task_id": task_id, "attempt_id": second["attempt_id"], "owner_id": "worker-b"}


def test_a10_two_tasks_on_one_resource_no_lost_update(operator, worker_a, worker_b, repo):
    first = operator.create(node_id="edit-1", resources=["repo:main"]).json()["task_id"]
    second = operator.create(node_id="edit-2", resources=["repo:main"]).json()["task_id"]
    read_by_b = worker_b.get("/resources/repo:main").json()  # revision 0
    claim_1 = worker_a.claim(first).json()

    held = worker_b.claim(second)
    worker_a.stage(claim_1, "patch-1")
    committed_1 = worker_a.commit(claim_1, "patch-1", resources=_named(repo))
    claim_2 = worker_b.claim(second).json()
    worker_b.stage(claim_2, "patch-2")
    stale = worker_b.commit(claim_2, "patch-2", resources=_named(read_by_b))
    omitted = worker_b.commit(claim_2, "patch-2", resources=[])
    reread = worker_b.get("/resources/repo:main").json()
    committed_2 = worker_b.commit(claim_2, "patch-2", resources=_named(reread))

    assert held.status_code == 409 and (held.json()["outcome"], held.json()["reason"]) == (
        "NOT_CLAIMABLE",
        "RESOURCE_HELD",
    )
    assert committed_1.status_code == 200
    assert stale.status_code == 409 and (stale.json()["outcome"], stale.json()["reason"]) == (
        "STALE_INPUT",
        "RESOURCE",
    )
    assert stale.json()["current"]["resource"]["revision"] == 1
    assert omitted.status_code == 400 and "resources" in omitted.json()["errors"]
    assert reread["revision"] == 1 and committed_2.status_code == 200
    assert (
        Resource.objects.get(key_id="repo:main", deleted_at__isnull=True).revision == 2
    )  # both writes counted


def test_claim_next_passes_over_a_task_whose_resource_is_held(operator, worker_a, worker_b, repo):
    holder = operator.create(node_id="edit", resources=["repo:main"]).json()["task_id"]
    blocked = operator.create(node_id="edit", resources=["repo:main"]).json()["task_id"]
    free = operator.create(node_id="lint").json()["task_id"]
    assert worker_a.claim(holder).status_code == 200

    got = worker_b.claim_next().json()["task_id"]

    assert got == free and Task.objects.get(pk=blocked).state == "READY"
    assert worker_b.claim_next().status_code == 204


def test_a11_an_old_incarnation_cannot_authorise_a_write_to_the_new_one(operator, worker_a, repo):
    task_id = operator.create(resources=["repo:main"]).json()["task_id"]
    claim = worker_a.claim(task_id).json()
    worker_a.stage(claim, "patch")
    operator.client.delete("/api/v1/resources/repo:main")
    recreated = operator.post("/resources", {"resource_key": "repo:main"}).json()

    with_old = worker_a.commit(claim, "patch", resources=_named(repo))
    with_new = worker_a.commit(claim, "patch", resources=_named(recreated))
    check_old = worker_a.post(
        "/resources/repo:main/check", {"fence_token": 1, "incarnation": repo["incarnation"]}
    )

    for response in (with_old, with_new):  # the attempt's fence was taken on the old incarnation
        assert (response.json()["outcome"], response.json()["reason"]) == ("STALE_INPUT", "RESOURCE")
    assert (check_old.json()["outcome"], check_old.json()["reason"]) == ("STALE_INPUT", "INCARNATION")
    assert Resource.objects.get(pk=recreated["incarnation"]).revision == 0
    assert Task.objects.get(pk=task_id).state == "CLAIMED"
    # The token counter belongs to the key: the next claim continues from it.
    assert ResourceKey.objects.get(pk="repo:main").fence_token == 1


def test_a12_a_delayed_old_generation_write_is_refused_after_takeover(
    operator, worker_a, worker_b, repo, db_clock
):
    task_id = operator.create(resources=["repo:main"]).json()["task_id"]
    old = worker_a.claim(task_id, ttl=5).json()
    check = {"incarnation": repo["incarnation"], "expected_revision": 0}
    current_before = worker_a.post("/resources/repo:main/check", {"fence_token": 1, **check})
    db_clock.travel(6)
    new = worker_b.claim(task_id).json()  # the takeover takes token 2 before B does anything

    delayed = worker_a.post(
        "/resources/repo:main/check", {"fence_token": old["fences"]["repo:main"], **check}
    )
    fresh = worker_b.post("/resources/repo:main/check", {"fence_token": new["fences"]["repo:main"], **check})
    wrong_revision = worker_b.post(
        "/resources/repo:main/check", {"fence_token": 2, **check, "expected_revision": 5}
    )

    assert current_before.json() == {"outcome": "CURRENT"}
    assert delayed.status_code == 409 and delayed.json()["outcome"] == "STALE_FENCE"
    assert fresh.json() == {"outcome": "CURRENT"}
    assert (wrong_revision.json()["outcome"], wrong_revision.json()["reason"]) == ("STALE_INPUT", "REVISION")


def test_a12_a_receiver_enforcing_tokens_in_its_own_database_refuses_the_delayed_write(db):
    with transaction.atomic():
        guard_write(ReportFence, resource_key="repo:main", token=2)  # the new holder writes first
    with transaction.atomic():
        guard_write(ReportFence, resource_key="repo:main", token=2)  # and again: equal tokens pass

    with pytest.raises(StaleToken), transaction.atomic():
        guard_write(ReportFence, resource_key="repo:main", token=1)  # the paused old holder, late

    assert ReportFence.objects.get(resource_key="repo:main").highest_token == 2
    assert parse_fence_header(["repo:main=2", "db:orders=5, cache=1"]) == {
        "repo:main": 2,
        "db:orders": 5,
        "cache": 1,
    }
    with pytest.raises(ValueError):
        parse_fence_header(["repo:main"])


def test_a12_the_dispatch_gateway_sends_the_fence_tokens_a_receiver_needs(
    operator, worker_a, repo, effect_target, django_capture_on_commit_callbacks
):
    task_id = operator.create(node_id="push", resources=["repo:main"]).json()["task_id"]
    claim = worker_a.claim(task_id).json()
    key = worker_a.prepare(claim, "push", {"ref": "abc"}).json()["effect_id"]

    with django_capture_on_commit_callbacks(execute=True):
        worker_a.dispatch(claim, key, {"ref": "abc"}, effect_target.url)

    assert effect_target.calls[key][0]["fences"] == ["repo:main=1"]


def test_unknown_resources_are_404_and_bad_checks_are_400(worker_a, repo):
    assert worker_a.get("/resources/nope").status_code == 404
    assert (
        worker_a.post(
            "/resources/nope/check", {"fence_token": 1, "incarnation": repo["incarnation"]}
        ).status_code
        == 404
    )
    assert (
        worker_a.post("/resources/repo:main/check", {"fence_token": "1", "incarnation": "x"}).status_code
        == 400
    )


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_of_tasks_sharing_a_resource_give_it_to_exactly_one(operator):
    import threading

    from tests.support.actors import make_actor
    from tests.support.races import run_in_thread

    operator.post("/resources", {"resource_key": "db:orders"})
    tasks = [operator.create(node_id="migrate", resources=["db:orders"]).json()["task_id"] for _ in range(12)]
    workers = [make_actor(f"contender-{i}", "worker") for i in range(12)]
    barrier = threading.Barrier(len(workers))

    def contend(worker, task_id, use_next):
        barrier.wait(10)
        response = worker.claim_next() if use_next else worker.claim(task_id)
        return response.status_code

    threads = [
        run_in_thread(lambda w=w, t=t, n=(i % 2 == 0): contend(w, t, n))
        for i, (w, t) in enumerate(zip(workers, tasks, strict=True))
    ]
    for thread, _ in threads:
        thread.join(30)

    statuses = [box["value"] for _, box in threads]
    assert statuses.count(200) == 1, statuses
    assert Task.objects.filter(state="CLAIMED").count() == 1
    assert ResourceKey.objects.get(pk="db:orders").fence_token == 1
