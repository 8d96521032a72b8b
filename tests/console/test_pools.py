"""The Pools page's numbers (issue 14 item 8): live leases per worker in its own namespace and per namespace and
pool — fenced attempts not counted, legacy-API leases counted — the staleness WORKER_STALE_SECONDS sets, and the same
figure the drain reports (one selector, ``oncall.selectors.live_leases``)."""

from __future__ import annotations

from tests.console.test_pages import login
from tests.support.actors import make_actor


def _register(actor, namespace: str, protocol: str = "claim.v1") -> None:
    body = {"protocol": protocol, "binary_version": "1.0", "namespace": namespace}
    assert actor.post("/workers/register", body).status_code == 201


def test_the_pools_page_counts_live_leases_per_namespace_and_pool_as_the_drain_does(
    operator, oncall, default_namespace, db_clock, settings
):
    settings.WORKER_STALE_SECONDS = 20
    viewer = login("viewer")
    v1 = make_actor("vera-v1", "worker", pool="v1")
    old = make_actor("lars-legacy", "worker", pool="legacy")
    assert operator.post("/namespaces", {"name": "shadowed", "stage": "SHADOW"}).status_code == 201
    _register(v1, "default")
    _register(v1, "shadowed")
    _register(old, "shadowed", protocol="legacy")

    fenced = operator.create().json()["task_id"]
    assert v1.claim(fenced).status_code == 200
    assert oncall.post("/namespaces/default/fence", {"reason": "drill"}).status_code == 200
    assert oncall.post("/namespaces/default/resume", {"reason": "drill over"}).status_code == 200
    live = operator.create().json()["task_id"]
    assert v1.claim(live, epoch=2).status_code == 200
    legacy_task = operator.create(namespace="shadowed").json()["task_id"]
    answer = old.client.post(
        f"/api/legacy/tasks/{legacy_task}/claim", {"owner_id": old.name, "ttl_seconds": 60}, format="json"
    )
    assert answer.status_code == 200, answer.content
    db_clock.travel(25)  # past the staleness, within every lease
    _register(v1, "default")  # a fresh heartbeat for one registration

    page = viewer.get("/pools/")

    held = {
        (w["reg"].namespace, w["reg"].principal): (w["held"], w["stale"]) for w in page.context["workers"]
    }
    assert held == {
        ("default", "vera-v1"): (1, False),  # the fenced attempt is not a live lease
        ("shadowed", "vera-v1"): (0, True),  # another namespace's lease is not counted here
        ("shadowed", "lars-legacy"): (1, True),
    }
    pools = {(p["namespace"], p["pool"]): p["total"] for p in page.context["pools"]}
    assert pools == {("default", "v1"): 1, ("shadowed", "legacy"): 1}
    # Issue 24: the legacy-API claim (judged by claim.v1 in SHADOW, so it is a claim.v1 attempt too) is counted
    # under Legacy API, not as a claim.v1 worker's lease.
    by_protocol = {(p["namespace"], p["pool"]): (p["v1"], p["legacy"]) for p in page.context["pools"]}
    assert by_protocol == {("default", "v1"): (1, 0), ("shadowed", "legacy"): (0, 1)}
    one = viewer.get("/pools/", {"ns": "shadowed"})
    assert {p["namespace"] for p in one.context["pools"]} == {"shadowed"}
    assert {w["reg"].namespace for w in one.context["workers"]} == {"shadowed"}
    for (namespace, pool), total in pools.items():
        snapshot = operator.post(f"/namespaces/{namespace}/drain?pool={pool}").json()
        assert snapshot["active_leases"] == total, (namespace, pool, snapshot)
    assert b"stale after 20 s" in page.content
