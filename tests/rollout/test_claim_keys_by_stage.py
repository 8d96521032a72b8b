"""A claim's Idempotency-Key by rollout stage (docs/workers.md, "Retrying a claim"): not used where legacy decides
the grant, used where claim.v1 does."""

from __future__ import annotations

import pytest

from claims.models import ClaimKey

pytestmark = pytest.mark.django_db(transaction=True)


def _next(actor, key: str, **fields):
    body = {"owner_id": actor.name, "scheduler_epoch": 1, "ttl_seconds": 30, **fields}
    return actor.client.post("/api/v1/claims", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_where_legacy_decides_the_key_is_not_used_and_where_claim_v1_writes_it_is(operator, oncall, worker_a):
    """SHADOW: legacy decides the grant and its protocol has no keys — none kept; V1_WRITES: claim.v1 decides,
    the key is kept and answers the repeat."""
    assert operator.post("/namespaces", {"name": "moving", "stage": "SHADOW"}).status_code == 201
    for _ in range(2):
        operator.create(namespace="moving")

    in_shadow = _next(worker_a, "s-1", namespace="moving")
    assert in_shadow.status_code == 200 and in_shadow.json()["decided_by"] == "legacy"
    assert not ClaimKey.objects.exists()
    for stage in ("V1_READS", "V1_WRITES"):
        moved = oncall.post(
            "/namespaces/moving/rollout/advance", {"to_stage": stage, "reason": "test", "override": True}
        )
        assert moved.status_code == 200, moved.json()
    written = _next(worker_a, "w-1", namespace="moving")
    again = _next(worker_a, "w-1", namespace="moving")
    assert written.status_code == 200 and again.json() == written.json()
    assert list(ClaimKey.objects.values_list("key", flat=True)) == ["w-1"]
