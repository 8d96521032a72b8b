"""The gate as a checklist (issue 14 item 3): each condition with its figure, what it needs and whether it is met,
counts as shares, links to what to look at; a waiver for a point with no traffic (audited); Advance only when the
gate holds, an on-call override labelled as one otherwise."""

from __future__ import annotations

from claims import clock
from claims.models import AuditEntry
from rollout.models import CoverageWaiver, Mismatch
from rollout.tasks import gate_check
from tests.console.test_pages import login


def _mismatch(ns: str, task_id: str) -> None:
    Mismatch.objects.create(
        namespace=ns, task_id=task_id, operation="complete", api="legacy", legacy={}, v1={},
        reason="STALE_COMMIT_ACCEPTED", at=clock.now(),
    )  # fmt: skip


def test_a_shut_shadow_gate_reads_as_a_checklist_with_links_and_no_advance_for_an_operator(
    operator, settings
):
    settings.ROLLOUT_MIN_SAMPLES = 3
    assert operator.post("/namespaces", {"name": "shady", "stage": "SHADOW"}).status_code == 201
    for _ in range(2):
        _mismatch("shady", operator.create(namespace="shady").json()["task_id"])
    gate_check("shady")

    operator_page = login("operator").get("/ns/shady/")
    oncall_page = login("oncall").get("/ns/shady/")

    rows = {row["label"]: row for row in operator_page.context["checklist"]}
    assert (
        rows["compared operations in the window"]["value"],
        rows["compared operations in the window"]["ok"],
    ) == (
        "0 of 3 needed",
        False,
    )
    assert (
        rows["open mismatches"]["value"] == "2"
        and rows["open mismatches"]["href"] == "/ns/shady/mismatches?status=OPEN"
    )
    assert b'href="/ns/shady/mismatches?status=OPEN">2</a>' in operator_page.content
    assert b'id="advance-link"' not in operator_page.content and b'id="advance-when"' in operator_page.content
    assert b'id="override-link"' in oncall_page.content and b"On-call override" in oncall_page.content


def test_a_point_with_no_traffic_is_waived_from_the_checklist_and_audited(operator, worker_a, settings):
    settings.ROLLOUT_MIN_COVERAGE_SAMPLES = 1
    assert operator.post("/namespaces", {"name": "reads", "stage": "V1_READS"}).status_code == 201
    task_id = operator.create(namespace="reads").json()["task_id"]
    worker_a.finish(worker_a.claim(task_id).json(), "done")
    gate_check("reads")
    ui = login("operator")

    before = {row["label"]: row for row in ui.get("/ns/reads/").context["checklist"]}
    unconfirmed = ui.post("/ns/reads/waive", {"point": "effect", "reason": "this namespace has no effects"})
    assert (
        unconfirmed.status_code == 400 and not CoverageWaiver.objects.exists()
    )  # the consequence not ticked
    ui.post(
        "/ns/reads/waive",
        {"point": "effect", "reason": "this namespace has no effects", "confirm_waive": "on"},
    )
    gate_check("reads")
    after = {row["label"]: row for row in ui.get("/ns/reads/").context["checklist"]}

    assert before["validated at claim"]["value"] == "all 1 validated" and before["validated at claim"]["ok"]
    assert (
        before["validated at effect"]["value"] == "no traffic" and before["validated at effect"]["waivable"]
    )
    assert after["validated at effect"]["value"] == "waived" and after["validated at effect"]["ok"]
    assert CoverageWaiver.objects.get(namespace="reads").point == "effect"
    assert AuditEntry.objects.filter(action="coverage_waive", principal="ui:operator-user").exists()


def test_gate_figures_never_round_up_to_met_nor_pass_100_percent():
    """Issue 36: "199/200 (100 %)" was shown for a gate not met, and "2303/200 (1152 %)"."""
    from rollout.console import _share, _validated

    assert _share(199, 200) == "199 of 200 needed"
    assert _share(2303, 200) == "met: 2303 (200 needed)"
    assert _validated(199, 200) == "199 of 200 validated (99 %)"
    assert _validated(200, 200) == "all 200 validated"
