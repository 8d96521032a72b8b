"""Validation coverage on /metrics (claim-v1.md §8), registered by the rollout app: claim.v1's own requests are
validated, the legacy API's mirrored ones are not — the same counts the coverage gate and API use."""

from __future__ import annotations

from rollout import selectors
from tests.claims.test_metrics import _sample


def test_validation_metrics_count_claim_v1_requests_as_validated(anonymous, worker_a, worker_b, ready_task):
    claim = worker_a.claim(ready_task).json()
    worker_b.claim(ready_task)  # refused: counted at the claim point
    worker_a.finish(claim, "done")

    text = anonymous.get("/metrics").content.decode()

    assert _sample(text, "claims_validation_total", '{point="claim",validated="true"}') == 2
    assert _sample(text, "claims_validation_total", '{point="claim",validated="false"}') == 0
    assert _sample(text, "claims_validation_coverage_ratio", '{point="commit"}') == 1.0
    assert selectors.validation_counts()["claim"] == {"validated": 2, "total": 2}


def test_mirrored_legacy_requests_are_counted_but_not_validated(anonymous, operator, worker_a):
    operator.post("/namespaces", {"name": "old", "stage": "SHADOW"})
    task_id = operator.create(namespace="old").json()["task_id"]
    worker_a.client.post(
        f"/api/legacy/tasks/{task_id}/claim", {"owner_id": "worker-a", "ttl_seconds": 30}, format="json"
    )

    text = anonymous.get("/metrics").content.decode()

    assert _sample(text, "claims_validation_total", '{point="claim",validated="false"}') == 1
    assert _sample(text, "claims_validation_coverage_ratio", '{point="claim"}') == 0.0


def test_the_validation_metric_is_exposed_before_traffic(anonymous, db):
    assert "claims_validation" in anonymous.get("/metrics").content.decode()


def test_the_observers_lag_is_on_metrics_beside_legacys_lease(anonymous, db):
    """Issue 34: how far behind legacy the observer's last pass ended, beside legacy's lease as last seen."""
    from claims import clock
    from rollout.models import ObserverPosition

    ObserverPosition.objects.create(
        name="binlog:jobs", behind_seconds=12.5, lease_seconds=1.0, updated_at=clock.now()
    )

    text = anonymous.get("/metrics").content.decode()

    assert _sample(text, "rollout_observer_behind_seconds", '{slot="binlog:jobs"}') == 12.5
    assert _sample(text, "rollout_observer_lease_seconds", '{slot="binlog:jobs"}') == 1.0
