"""A fence is a fence in every stage (issue 34, point 6). Where legacy decides (SHADOW, V1_READS) a fence ends every
claim.v1 attempt granted before it — but legacy knows no epochs and keeps its own leases until they expire:

- the drain counts legacy's live leases, read from the legacy store (their table through the adapter, or the
  emulated one) — a fenced namespace is not "drained" while legacy still holds a lease;
- in proxy mode a legacy-protocol heartbeat or complete under a lease from before the fence is refused (409
  FENCED, reason EPOCH) and legacy is not asked: nothing is written to their table; a release goes through — it
  ends legacy's lease, which is what the drain waits for;
- a claim legacy then refuses (HELD by that pre-fence lease) while claim.v1 grants is recorded as the fence's own
  disagreement, FENCE_UNSEEN_BY_LEGACY, EXPLAINED at once: not a DOUBLE_GRANT, and the gate is not held by it.

Seen failing before: the drain said 0 live leases, the stale heartbeat and complete got 200 and completed the row,
and every later claim recorded an OPEN DOUBLE_GRANT. On the emulated table and on their own (PostgreSQL, MariaDB)."""

from __future__ import annotations

import pytest

from claims.models import Task
from rollout.models import Mismatch
from rollout.services.stages import drain_snapshot, evaluate_gate
from tests.support.console import login
from tests.support.legacy_db import ALIASES, NS, Their, their_table_configured

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", *ALIASES]),
]
STORES = ["emulated", *ALIASES]


@pytest.fixture(params=STORES)
def store(request):
    if request.param == "emulated":
        yield None
        return
    db = Their(request.param)
    db.create_jobs()
    with their_table_configured(request.param):
        yield db
    db.sql("DROP TABLE IF EXISTS jobs")


def _task(operator, their) -> str:
    task_id = operator.create(namespace=NS).json()["task_id"]
    if their is not None:
        their.sql("INSERT INTO jobs (job_id, queue, payload) VALUES (%s, %s, 'p')", [task_id, NS])
    return task_id


def _legacy(actor, task_id: str, op: str, **body):
    return actor.client.post(
        f"/api/legacy/tasks/{task_id}/{op}", {"owner_id": actor.name, **body}, format="json"
    )


def test_a_fence_where_legacy_decides_drains_on_legacys_leases_and_refuses_their_stale_holders(
    store, operator, oncall, worker_a, worker_b
):
    their = store
    assert operator.post("/namespaces", {"name": NS, "stage": "SHADOW"}).status_code == 201
    by_v1, by_legacy = _task(operator, their), _task(operator, their)
    assert (
        worker_a.claim(by_v1, ttl=200).status_code == 200
    )  # a claim.v1 worker: legacy records its own lease
    assert _legacy(worker_b, by_legacy, "claim", ttl_seconds=200).status_code == 200  # an old binary, proxied

    fenced = oncall.post(f"/namespaces/{NS}/fence", {"reason": "incident"})
    assert fenced.status_code in (200, 201), fenced.json()

    assert drain_snapshot(namespace=NS).active_leases == 2  # legacy still holds both: not drained
    page = login("viewer").get(f"/ns/{NS}/incident").content.decode()
    assert "legacy keeps its own until they expire — 2 live in it now, and the drain waits for them" in page
    heartbeat = _legacy(worker_b, by_legacy, "heartbeat", ttl_seconds=200)
    complete = _legacy(
        worker_b, by_legacy, "complete", result={"stale": True}, result_digest=_digest({"stale": True})
    )
    for answer in (heartbeat, complete):
        assert answer.status_code == 409, answer.json()
        assert (answer.json()["outcome"], answer.json().get("reason")) == ("FENCED", "EPOCH")
    if their is not None:
        assert their.sql("SELECT finished_by, output FROM jobs WHERE job_id = %s", [by_legacy])[0] == (
            None,
            None,
        )

    assert oncall.post(f"/namespaces/{NS}/resume", {"reason": "incident over"}).status_code == 200
    held = _legacy(worker_b, by_v1, "claim", ttl_seconds=30)  # legacy: HELD by worker-a's pre-fence lease

    assert held.status_code == 409 and held.json()["outcome"] == "HELD"
    mismatches = list(
        Mismatch.objects.filter(namespace=NS).order_by("id").values_list("operation", "reason", "status")
    )
    assert mismatches == [("claim", "FENCE_UNSEEN_BY_LEGACY", "EXPLAINED")]  # (the release: both agreed)
    assert Task.objects.get(pk=by_v1).state != "COMMITTED"
    gate = evaluate_gate(namespace=NS)
    assert gate is not None and gate.figures["open_mismatches"] == 0  # the gate is not held by the fence


def _digest(value) -> str:
    from claims.digest import digest

    return digest(value)
