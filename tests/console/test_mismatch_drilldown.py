"""The mismatch drill-down (issue 14 item 4): both winners with their results and a diff; one timeline of both
stores on one time axis with the disagreeing operation marked; what the reason means; previous and next open; and
bulk review of several with one note."""

from __future__ import annotations

from claims.digest import digest
from claims.models import AuditEntry
from rollout.models import Mismatch
from tests.console.test_pages import login


def _legacy(actor, task_id, op, **body):
    return actor.client.post(
        f"/api/legacy/tasks/{task_id}/{op}", {"owner_id": actor.name, **body}, format="json"
    )


def _stale_commit(operator, worker_a, worker_b, db_clock, namespace: str = "shade") -> str:
    """A16: A pauses past its lease, B takes over and completes, A completes late — legacy keeps A's."""
    task_id = operator.create(namespace=namespace, node_id="settle").json()["task_id"]
    _legacy(worker_a, task_id, "claim", ttl_seconds=5)
    db_clock.travel(6)
    _legacy(worker_b, task_id, "claim", ttl_seconds=30)
    _legacy(worker_b, task_id, "complete", result={"by": "b"}, result_digest=digest({"by": "b"}))
    _legacy(worker_a, task_id, "complete", result={"by": "a"}, result_digest=digest({"by": "a"}))
    return task_id


def test_the_drilldown_shows_both_winners_a_diff_and_one_timeline(operator, worker_a, worker_b, db_clock):
    assert operator.post("/namespaces", {"name": "shade", "stage": "SHADOW"}).status_code == 201
    first_task = _stale_commit(operator, worker_a, worker_b, db_clock)
    _stale_commit(operator, worker_a, worker_b, db_clock)
    first, second = Mismatch.objects.order_by("id")

    page = login("viewer").get(f"/mismatches/{first.pk}")
    ctx = page.context

    assert (ctx["winners"]["legacy"]["owner"], ctx["winners"]["legacy"]["result"]) == (
        "worker-a",
        {"by": "a"},
    )
    assert (ctx["winners"]["v1"]["owner"], ctx["winners"]["v1"]["result"]) == ("worker-b", {"by": "b"})
    assert '-  "by": "a"' in ctx["diff"] and '+  "by": "b"' in ctx["diff"]
    stores = {entry["store"] for entry in ctx["timeline"]}
    times = [entry["at"] for entry in ctx["timeline"]]
    assert stores == {"legacy", "claim.v1"} and times == sorted(times)
    marked = [entry for entry in ctx["timeline"] if entry["offending"]]
    assert len(marked) == 1 and marked[0]["store"] == "legacy" and "worker-a" in marked[0]["what"]
    assert "lost update" in ctx["explanation"]
    assert ctx["next_open"] == second.pk and ctx["previous_open"] is None
    assert first.task_id == first_task and b'id="diff"' in page.content and b"{&#x27;" not in page.content


def test_several_mismatches_are_reviewed_with_one_note(operator, worker_a, worker_b, db_clock):
    assert operator.post("/namespaces", {"name": "shade", "stage": "SHADOW"}).status_code == 201
    for _ in range(3):
        _stale_commit(operator, worker_a, worker_b, db_clock)
    ids = list(Mismatch.objects.order_by("id").values_list("pk", flat=True))
    ui = login("operator")

    refused = ui.post(
        "/ns/shade/mismatches/review", {"ids": ids[:2], "status": "EXPLAINED", "note": ""}, follow=True
    )
    reviewed = ui.post(
        "/ns/shade/mismatches/review", {"ids": ids[:2], "status": "EXPLAINED", "note": "known legacy race"}
    )

    assert b"needs a note" in refused.content, [m.message for m in refused.context["messages"]]
    assert reviewed.status_code == 302
    assert list(Mismatch.objects.order_by("id").values_list("status", "note")) == [
        ("EXPLAINED", "known legacy race"),
        ("EXPLAINED", "known legacy race"),
        ("OPEN", ""),
    ]
    assert AuditEntry.objects.filter(action="mismatch_review").count() == 2
    huge = ui.post("/ns/shade/mismatches/review", {"ids": [str(10**20)], "status": "BUG"})
    assert huge.status_code == 302 and Mismatch.objects.filter(status="BUG").count() == 0
    assert (
        login("viewer").post("/ns/shade/mismatches/review", {"ids": ids[2:], "status": "BUG"}).status_code
        == 403
    )


def test_the_report_answers_when_a_mismatch_is_recorded_after_its_clock(operator):
    """Issue 24: a mismatch stamped after the report read its clock overflowed the chart's hours (a 500)."""
    from datetime import timedelta

    from claims import clock

    assert operator.post("/namespaces", {"name": "shade", "stage": "SHADOW"}).status_code == 201
    Mismatch.objects.create(
        namespace="shade", task_id="t", operation="complete", api="legacy", legacy={}, v1={},
        reason="STALE_COMMIT_ACCEPTED", at=clock.now() + timedelta(seconds=5),
    )  # fmt: skip

    page = login("viewer").get("/ns/shade/mismatches")

    assert page.status_code == 200
    counted = sum(sum(d["data"]) for d in page.context["over_time"]["by_reason"]["datasets"])
    assert counted == 0  # the next load's
