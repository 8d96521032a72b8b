"""Priority and fair share in every rollout stage (claim-v1.md §10; docs/adopting.md, "Priority and fair share"):
where legacy decides (SHADOW, V1_READS) the task a claim-next asks legacy for is claim.v1's pick, in grant order;
where claim.v1 decides, its own. A batch claim is the same order, in every stage."""

from __future__ import annotations

import pytest

from claims.models import Task

pytestmark = pytest.mark.django_db(transaction=True)

MOVES = {
    "V1_READS": ["V1_READS"],
    "V1_WRITES": ["V1_READS", "V1_WRITES"],
    "V1_ONLY": ["V1_READS", "V1_WRITES", "V1_ONLY"],
}


@pytest.mark.parametrize("stage", ["SHADOW", "V1_READS", "V1_WRITES", "V1_ONLY"])
def test_the_grant_order_holds_in_every_stage(operator, oncall, worker_a, stage):
    assert operator.post("/namespaces", {"name": "moving", "stage": "SHADOW"}).status_code == 201
    for to_stage in MOVES.get(stage, []):
        moved = oncall.post(
            "/namespaces/moving/rollout/advance", {"to_stage": to_stage, "reason": "test", "override": True}
        )
        assert moved.status_code == 200, moved.json()
    for task_id, fields in [
        ("a-old", {"fairness_key": "a"}),
        ("a-new", {"fairness_key": "a"}),
        ("b-only", {"fairness_key": "b", "fairness_weight": 2}),  # placed half a unit on: between a's two
        ("late-urgent", {"priority": 1}),
    ]:
        assert operator.create(task_id=task_id, namespace="moving", **fields).status_code == 201
    body = {"owner_id": worker_a.name, "scheduler_epoch": 1, "ttl_seconds": 30, "namespace": "moving"}

    first = worker_a.post("/claims", body).json()
    rest = worker_a.post("/claims/batch", {**body, "max_tasks": 3}).json()["claims"]

    assert first["task_id"] == "late-urgent"
    assert [grant["task_id"] for grant in rest] == ["a-old", "b-only", "a-new"]
    assert set(Task.objects.values_list("owner_id", flat=True)) == {worker_a.name}
