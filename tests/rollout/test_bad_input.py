"""Bad input at the rollout's endpoints is a 400 and changes nothing (the core's cases: tests/claims/test_bad_input.py)."""

from __future__ import annotations

import pytest

from claims.models import AuditEntry, Task, TaskEvent
from rollout.models import DrainSnapshot
from tests.claims.test_bad_input import LONE, raw


@pytest.mark.parametrize(
    ("path", "template"),
    [
        ("/namespaces", '{"name": "x", "stage": %s}'),
        ("/namespaces", '{"name": "x", "min_protocol": %s}'),
        ("/namespaces/default/rollout/advance", '{"to_stage": %s, "reason": "r"}'),
        ("/namespaces/default/coverage/waive", '{"point": %s, "reason": "r"}'),
        ("/namespaces/default/explain-rules", '{"reason": %s, "note": "n"}'),
    ],
)
def test_a_lone_surrogate_in_any_rollout_field_is_400(oncall, default_namespace, path, template):
    before = (Task.objects.count(), AuditEntry.objects.count(), TaskEvent.objects.count())

    response = raw(oncall, path, template % LONE)

    assert response.status_code == 400, response.content[:300]
    assert response.json()["outcome"] == "INVALID"
    assert (Task.objects.count(), AuditEntry.objects.count(), TaskEvent.objects.count()) == before


@pytest.mark.parametrize("pool", ["a\x00b", "p" * 101])
def test_a_drain_pool_no_pool_could_have_is_400(operator, default_namespace, pool):
    read = operator.client.get("/api/v1/namespaces/default/drain", {"pool": pool})
    taken = operator.client.post(f"/api/v1/namespaces/default/drain?pool={pool}")

    assert read.status_code == taken.status_code == 400
    assert "pool" in read.json()["errors"]
    assert not DrainSnapshot.objects.exists()


def test_reading_the_drain_before_any_snapshot_records_none(operator, default_namespace):
    response = operator.get("/namespaces/default/drain")

    assert response.status_code == 200 and response.json()["taken_at"] is None
    assert not DrainSnapshot.objects.exists()
