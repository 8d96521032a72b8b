"""The legacy protocol and its shadow (rollout.md): legacy decides in SHADOW, claim.v1 judges every operation,
and a disagreement is a mismatch record (A15 for the legacy API, A16 for a paused legacy worker)."""

from __future__ import annotations

import pytest

from claims.digest import digest
from claims.models import Task, TaskEvent
from rollout.models import ComparedOperation, LegacyClaim, Mismatch


@pytest.fixture
def shadow_ns(operator):
    assert operator.post("/namespaces", {"name": "payments", "stage": "SHADOW"}).status_code == 201
    return "payments"


def legacy(actor, task_id: str, op: str, **body):
    return actor.client.post(
        f"/api/legacy/tasks/{task_id}/{op}", {"owner_id": actor.name, **body}, format="json"
    )


def test_in_legacy_the_naive_table_alone_decides(operator, worker_a, worker_b, db_clock):
    operator.post("/namespaces", {"name": "old", "stage": "LEGACY"})
    task_id = operator.create(namespace="old").json()["task_id"]

    a = legacy(worker_a, task_id, "claim", ttl_seconds=5)
    held = legacy(worker_b, task_id, "claim", ttl_seconds=5)
    db_clock.travel(6)
    b = legacy(worker_b, task_id, "claim", ttl_seconds=5)
    not_owner = legacy(worker_a, task_id, "heartbeat", ttl_seconds=5)

    assert a.status_code == 200 and a.json()["owner_id"] == "worker-a"
    assert (
        held.status_code == 409 and held.json()["outcome"] == "HELD" and held.json()["owner_id"] == "worker-a"
    )
    assert b.status_code == 200
    assert not_owner.status_code == 409 and not_owner.json()["outcome"] == "NOT_OWNER"
    assert Task.objects.get(pk=task_id).claim_generation == 0  # claim.v1 is not written in LEGACY
    assert not ComparedOperation.objects.exists()


def test_a16_a_paused_legacy_worker_overwrites_in_legacy_and_is_fenced_in_claim_v1(
    operator, worker_a, worker_b, shadow_ns, db_clock
):
    task_id = operator.create(namespace=shadow_ns, node_id="settle").json()["task_id"]
    assert legacy(worker_a, task_id, "claim", ttl_seconds=5).status_code == 200
    db_clock.travel(6)  # A pauses past expiry
    assert legacy(worker_b, task_id, "claim", ttl_seconds=30).status_code == 200
    assert (
        legacy(
            worker_b, task_id, "complete", result={"by": "b"}, result_digest=digest({"by": "b"})
        ).status_code
        == 200
    )

    late = legacy(worker_a, task_id, "complete", result={"by": "a"}, result_digest=digest({"by": "a"}))

    assert late.status_code == 200  # legacy accepts A's overwrite: last write wins
    assert LegacyClaim.objects.get(pk=task_id).result == {"by": "a"}
    task = Task.objects.get(pk=task_id)
    assert (task.state, task.result, task.claim_generation) == (
        "COMMITTED",
        {"by": "b"},
        2,
    )  # claim.v1 fenced it
    mismatch = Mismatch.objects.get()
    assert (mismatch.reason, mismatch.operation, mismatch.api, mismatch.status) == (
        "STALE_COMMIT_ACCEPTED",
        "complete",
        "legacy",
        "OPEN",
    )
    assert mismatch.legacy == {"verdict": "COMPLETED", "owner_id": "worker-a"}
    assert (mismatch.v1["verdict"], mismatch.v1["reason"], mismatch.v1["claim_generation"]) == (
        "FENCED",
        "GENERATION",
        None,
    )
    assert ComparedOperation.objects.filter(agreed=True).count() == 3
    # Mirrored legacy operations are counted at their points, passed on from legacy: never validated.
    mirrored = TaskEvent.objects.filter(task_id=task_id, point__isnull=False)
    assert mirrored.exists() and set(mirrored.values_list("via", flat=True)) == {"legacy"}


def test_a15_the_legacy_api_is_refused_from_v1_writes_on(operator, worker_a):
    operator.post("/namespaces", {"name": "moved", "stage": "V1_WRITES"})
    task_id = operator.create(namespace="moved").json()["task_id"]

    response = legacy(worker_a, task_id, "claim", ttl_seconds=5)

    assert response.status_code == 409 and response.json()["outcome"] == "PROTOCOL_TOO_OLD"
    assert not LegacyClaim.objects.exists()


def test_a_paused_namespace_grants_no_legacy_claim(operator, worker_a, oncall, shadow_ns):
    task_id = operator.create(namespace=shadow_ns).json()["task_id"]
    oncall.post(f"/namespaces/{shadow_ns}/fence", {"reason": "incident"})

    response = legacy(worker_a, task_id, "claim", ttl_seconds=5)

    assert response.status_code == 409 and response.json()["outcome"] == "CLAIMS_PAUSED"
    assert not LegacyClaim.objects.exists()


def test_a_worker_acts_only_as_itself_on_the_legacy_api_too(operator, worker_a, shadow_ns):
    task_id = operator.create(namespace=shadow_ns).json()["task_id"]

    response = worker_a.client.post(
        f"/api/legacy/tasks/{task_id}/claim", {"owner_id": "worker-b", "ttl_seconds": 5}, format="json"
    )

    assert response.status_code == 403 and not LegacyClaim.objects.exists()


def test_a_double_grant_is_a_mismatch(operator, worker_a, worker_b, shadow_ns):
    from claims import services
    from claims.models import Principal

    task_id = operator.create(namespace=shadow_ns).json()["task_id"]
    a = Principal.objects.get(name="worker-a")
    # A live claim.v1 attempt the legacy table does not know of (written through the core, as claim.v1 alone would).
    services.task_claim(principal=a, task_id=task_id, owner_id=a.name, scheduler_epoch=1, ttl_seconds=30)

    granted = legacy(worker_b, task_id, "claim", ttl_seconds=5)

    assert granted.status_code == 200  # the legacy table knows nothing of A
    assert Mismatch.objects.get().reason == "DOUBLE_GRANT"
