"""The claim.v1 API by stage (rollout.md): LEGACY refuses it, SHADOW lets legacy decide and judges in shadow,
V1_WRITES decides in claim.v1 and writes the legacy store too, the epoch rule holds in every stage."""

from __future__ import annotations

import pytest

from claims.models import Task
from rollout.models import LegacyClaim, Mismatch


@pytest.fixture
def ns_at(operator):
    def make(stage: str) -> str:
        name = stage.lower().replace("_", "-")
        assert operator.post("/namespaces", {"name": name, "stage": stage}).status_code == 201
        return name

    return make


def test_the_claim_v1_api_is_not_open_at_legacy(operator, worker_a, ns_at):
    task_id = operator.create(namespace=ns_at("LEGACY")).json()["task_id"]

    response = worker_a.claim(task_id)

    assert response.status_code == 409 and response.json()["outcome"] == "STAGE_NOT_OPEN"
    assert Task.objects.get(pk=task_id).claim_generation == 0


def test_a16_with_the_claim_v1_api_legacy_decides_and_the_shadow_fences_the_late_commit(
    operator, worker_a, worker_b, ns_at, db_clock
):
    task_id = operator.create(namespace=ns_at("SHADOW"), node_id="settle").json()["task_id"]
    claim_a = worker_a.claim(task_id, ttl=5).json()
    worker_a.stage(claim_a, {"by": "a"})
    db_clock.travel(6)
    claim_b = worker_b.claim(task_id, ttl=30).json()
    worker_b.stage(claim_b, {"by": "b"})
    committed_b = worker_b.commit(claim_b, {"by": "b"})

    late = worker_a.commit(claim_a, {"by": "a"})

    assert (
        claim_a["decided_by"] == "legacy"
        and claim_a["attempt_id"]
        and claim_a["shadow"]["verdict"] == "CLAIMED"
    )
    assert claim_b["claim_generation"] == 2 and committed_b.json()["shadow"]["mismatch_id"] is None
    assert (
        late.status_code == 200 and late.json()["outcome"] == "COMMITTED"
    )  # legacy decided: last write wins
    assert late.json()["shadow"]["verdict"] == "FENCED" and late.json()["shadow"]["reason"] == "GENERATION"
    mismatch = Mismatch.objects.get(pk=late.json()["shadow"]["mismatch_id"])
    assert (mismatch.reason, mismatch.api, mismatch.status) == ("STALE_COMMIT_ACCEPTED", "claim.v1", "OPEN")
    assert LegacyClaim.objects.get(pk=task_id).result == {"by": "a"}  # the overwrite legacy allowed
    assert Task.objects.get(pk=task_id).result == {"by": "b"}  # the winner claim.v1 kept


def test_in_shadow_a_claim_legacy_refuses_is_409_held_with_the_shadow_fields(
    operator, worker_a, worker_b, ns_at
):
    task_id = operator.create(namespace=ns_at("SHADOW")).json()["task_id"]
    worker_a.claim(task_id)

    response = worker_b.claim(task_id)

    body = response.json()
    assert (
        response.status_code == 409
        and body["outcome"] == "HELD"
        and body["current"]["owner_id"] == "worker-a"
    )
    assert body["attempt_id"] is None and body["decided_by"] == "legacy"
    assert body["shadow"]["verdict"] == "NOT_CLAIMABLE" and body["shadow"]["mismatch_id"] is None  # agreement


def test_the_epoch_rule_holds_in_shadow_before_legacy_is_asked(operator, worker_a, oncall, ns_at):
    ns = ns_at("SHADOW")
    task_id = operator.create(namespace=ns).json()["task_id"]
    claim = worker_a.claim(task_id).json()
    worker_a.stage(claim, "r")
    oncall.post(f"/namespaces/{ns}/fence", {"reason": "rollback"})
    oncall.post(f"/namespaces/{ns}/resume", {})

    response = worker_a.commit(claim, "r", scheduler_epoch=2)

    assert (response.json()["outcome"], response.json()["reason"]) == ("FENCED", "EPOCH")
    assert LegacyClaim.objects.get(pk=task_id).result is None  # legacy was never asked


def test_v1_writes_decides_in_claim_v1_and_writes_the_legacy_store_for_rollback(operator, worker_a, ns_at):
    task_id = operator.create(namespace=ns_at("V1_WRITES")).json()["task_id"]

    claim = worker_a.claim(task_id).json()
    worker_a.stage(claim, {"v": 1})
    committed = worker_a.commit(claim, {"v": 1})

    assert claim["outcome"] == "CLAIMED" and "decided_by" not in claim
    assert committed.status_code == 200
    row = LegacyClaim.objects.get(pk=task_id)
    assert (row.owner_id, row.result, row.via) == ("worker-a", {"v": 1}, "claim.v1")


def test_reads_show_the_legacy_store_in_legacy_and_shadow_and_claim_v1_from_v1_reads(
    operator, worker_a, ns_at
):
    def legacy(actor, task_id, op, **body):
        return actor.client.post(
            f"/api/legacy/tasks/{task_id}/{op}", {"owner_id": actor.name, **body}, format="json"
        )

    ns = ns_at("LEGACY")
    claimed = operator.create(namespace=ns).json()["task_id"]
    free = operator.create(namespace=ns).json()["task_id"]
    legacy(worker_a, claimed, "claim", ttl_seconds=30)

    detail = worker_a.get(f"/tasks/{claimed}").json()
    frontier = worker_a.get("/tasks", namespace=ns, state="READY").json()
    v1_ns = ns_at("V1_READS")
    v1_task = operator.create(namespace=v1_ns).json()["task_id"]

    assert (detail["state"], detail["owner_id"], detail["read_from"]) == ("CLAIMED", "worker-a", "legacy")
    assert [t["task_id"] for t in frontier["results"]] == [free]
    assert "read_from" not in worker_a.get(f"/tasks/{v1_task}").json()
    # The task creation path (POST /tasks) still goes to the core.
    assert operator.create(namespace=ns).status_code == 201


def test_claim_next_by_stage(operator, worker_a, ns_at):
    legacy_ns, shadow_ns, writes_ns = ns_at("LEGACY"), ns_at("SHADOW"), ns_at("V1_WRITES")
    operator.create(namespace=legacy_ns)
    in_shadow = operator.create(namespace=shadow_ns).json()["task_id"]
    in_writes = operator.create(namespace=writes_ns).json()["task_id"]

    closed = worker_a.claim_next(namespace=legacy_ns)
    shadow = worker_a.claim_next(namespace=shadow_ns).json()
    writes = worker_a.claim_next(namespace=writes_ns).json()

    assert closed.status_code == 409 and closed.json()["outcome"] == "STAGE_NOT_OPEN"
    assert (shadow["task_id"], shadow["decided_by"], shadow["shadow"]["mismatch_id"]) == (
        in_shadow,
        "legacy",
        None,
    )
    assert LegacyClaim.objects.get(pk=in_shadow).owner_id == "worker-a"
    assert writes["task_id"] == in_writes and "decided_by" not in writes
    assert LegacyClaim.objects.get(pk=in_writes).via == "claim.v1"


def test_in_shadow_a_batch_leaves_no_claim_v1_attempt_for_a_task_legacy_refused(operator, worker_a, ns_at):
    """Issue 21, 6: claim.v1 granted the oldest task, legacy refused it (its table says another owner holds it), and
    the batch left that task out of its answer — but the claim.v1 attempt stayed, for a worker never told of it,
    until its lease ran out."""
    from datetime import timedelta

    from claims.clock import now
    from claims.models import Attempt

    ns = ns_at("SHADOW")
    held = operator.create(namespace=ns, node_id="held").json()["task_id"]
    free = [operator.create(namespace=ns, node_id=f"free-{i}").json()["task_id"] for i in range(2)]
    LegacyClaim.objects.update_or_create(  # a legacy binary holds it, in the table claim.v1 does not read
        pk=held,
        defaults={
            "namespace": ns,
            "owner_id": "legacy-binary",
            "expires_at": now() + timedelta(seconds=60),
            "updated_at": now(),
        },
    )
    answer = worker_a.claim_batch(5, namespace=ns)

    assert answer.status_code == 200, answer.content
    told = {claim["task_id"] for claim in answer.json()["claims"]}
    assert told == set(free)
    live = Attempt.objects.filter(owner_id="worker-a", ended_at__isnull=True)
    assert set(live.values_list("task_id", flat=True)) == told
    assert Task.objects.get(pk=held).state == "READY"
