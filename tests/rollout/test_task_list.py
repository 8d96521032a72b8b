"""GET /api/v1/tasks?state= by stage (issue 13 item 7): the list filters on an indexed column where claim.v1 is read
and on a narrowed candidate set where legacy is read — and lists exactly what the task read shows, task by task,
in every stage, with and without a namespace."""

from __future__ import annotations

import pytest

from claims.digest import digest

STATES = ["READY", "CLAIMED", "COMMITTED", "BLOCKED", "CANCELLED"]


def _legacy(actor, task_id, op, **body):
    return actor.client.post(
        f"/api/legacy/tasks/{task_id}/{op}", {"owner_id": actor.name, **body}, format="json"
    )


@pytest.fixture
def mixed(operator, worker_a, worker_b, db_clock):
    """Namespaces in LEGACY, SHADOW and V1_READS, each with a task in every state a reader can see."""
    made = []
    for stage in ("LEGACY", "SHADOW", "V1_READS"):
        ns = f"list-{stage.lower().replace('_', '-')}"
        assert operator.post("/namespaces", {"name": ns, "stage": stage}).status_code == 201
        ids = [operator.create(namespace=ns).json()["task_id"] for _ in range(5)]
        blocked = operator.create(namespace=ns, depends_on=[ids[0]]).json()["task_id"]
        assert operator.post(f"/tasks/{ids[4]}/cancel", {"reason": "not needed"}).status_code == 200
        if stage == "V1_READS":
            worker_a.claim(ids[1])
            worker_a.finish(worker_a.claim(ids[2]).json(), "done")
            worker_b.claim(ids[3], ttl=1)  # expires: a CLAIMED task whose lease ran out
        else:
            _legacy(worker_a, ids[1], "claim", ttl_seconds=300)
            _legacy(worker_a, ids[2], "claim", ttl_seconds=300)
            _legacy(worker_a, ids[2], "complete", result={"v": 1}, result_digest=digest({"v": 1}))
            _legacy(worker_b, ids[3], "claim", ttl_seconds=1)  # expires: READY again to a legacy reader
        made.append((ns, [*ids, blocked]))
    db_clock.travel(5)
    return made


def _listed(actor, **params) -> list[str]:
    body = actor.get("/tasks", page_size=500, **params).json()
    return [t["task_id"] for t in body["results"]]


def _seen(actor, task_ids) -> dict[str, str]:
    return {task_id: actor.get(f"/tasks/{task_id}").json()["state"] for task_id in task_ids}


@pytest.mark.parametrize("state", STATES)
def test_the_list_by_state_is_what_each_task_read_shows(operator, mixed, state):
    every = [task_id for _, ids in mixed for task_id in ids]
    seen = _seen(operator, every)

    assert _listed(operator, state=state) == [t for t in every if seen[t] == state]
    for ns, ids in mixed:
        assert _listed(operator, namespace=ns, state=state) == [t for t in ids if seen[t] == state]
    assert any(seen[t] == state for t in every)  # each state is present: the comparison is not vacuous
