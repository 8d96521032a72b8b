"""Epoch fences (claim-v1.md §1 and §7) and A3: an attempt granted before a fence is fenced everywhere."""

from __future__ import annotations

import pytest
from django.apps import apps

from claims.models import Attempt, AuditEntry, Namespace, Task, TaskEvent


def test_fence_pauses_claims_and_bumps_the_epoch_with_an_audit_entry(oncall, default_namespace):
    response = oncall.post("/namespaces/default/fence", {"reason": "incident 42"})

    assert response.status_code == 200
    assert response.json() == {"outcome": "FENCED_EPOCH", "scheduler_epoch": 2, "claims_paused": True}
    namespace = Namespace.objects.get(name="default")
    assert (namespace.scheduler_epoch, namespace.claims_paused) == (2, True)
    entry = AuditEntry.objects.get(action="epoch_fence")
    assert (entry.principal, entry.role, entry.reason) == ("oscar-oncall", "oncall", "incident 42")


def test_only_oncall_fences_and_resumes(operator, worker_a, default_namespace):
    assert operator.post("/namespaces/default/fence", {"reason": "x"}).status_code == 403
    assert worker_a.post("/namespaces/default/fence", {"reason": "x"}).status_code == 403
    assert operator.post("/namespaces/default/resume", {}).status_code == 403
    assert Namespace.objects.get(name="default").scheduler_epoch == 1
    assert not AuditEntry.objects.exists()


def test_a_fence_needs_a_reason(oncall, default_namespace):
    response = oncall.post("/namespaces/default/fence", {})

    assert response.status_code == 400 and "reason" in response.json()["errors"]
    assert Namespace.objects.get(name="default").scheduler_epoch == 1


def test_resume_lifts_the_pause_and_keeps_the_epoch(oncall, default_namespace):
    oncall.post("/namespaces/default/fence", {"reason": "drill"})

    response = oncall.post("/namespaces/default/resume", {"reason": "all clear"})

    assert response.status_code == 200 and response.json()["claims_paused"] is False
    assert response.json()["scheduler_epoch"] == 2
    assert AuditEntry.objects.filter(action="namespace_resume", principal="oscar-oncall").exists()


@pytest.mark.parametrize("resent_epoch", [1, 2], ids=["old-epoch", "new-epoch-resent"])
def test_a3_a_paused_holder_is_fenced_by_epoch_at_every_acceptance_point(
    worker_a, ready_task, oncall, resent_epoch
):
    claim = worker_a.claim(ready_task).json()
    worker_a.stage(claim, {"v": 1})
    oncall.post("/namespaces/default/fence", {"reason": "rollback"})
    oncall.post("/namespaces/default/resume", {})
    resent = {**claim, "scheduler_epoch": resent_epoch}
    before = Task.objects.values().get(pk=ready_task)

    renew = worker_a.renew(resent)
    commit = worker_a.commit(resent, {"v": 1})
    release = worker_a.release(resent)

    for response in (renew, commit, release):
        assert response.status_code == 409
        assert (response.json()["outcome"], response.json()["reason"]) == ("FENCED", "EPOCH")
        assert response.json()["current"]["scheduler_epoch"] == 2
    assert Task.objects.values().get(pk=ready_task) == before
    # Each rejection counted once, at its own acceptance point, as a claim.v1 request of its own (via "").
    points = sorted(TaskEvent.objects.filter(task_id=ready_task, kind="fenced").values_list("point", "via"))
    assert points == [("commit", ""), ("release", ""), ("renew", "")]


def test_the_fence_marks_live_attempts_fenced_and_writes_their_timelines(
    worker_a, worker_b, operator, oncall
):
    first = worker_a.claim(operator.create().json()["task_id"]).json()
    second = worker_b.claim(operator.create().json()["task_id"]).json()

    oncall.post("/namespaces/default/fence", {"reason": "rollback"})

    assert set(Attempt.objects.filter(end_reason="FENCED").values_list("attempt_id", flat=True)) == {
        Attempt.objects.get(pk=first["attempt_id"]).pk,
        Attempt.objects.get(pk=second["attempt_id"]).pk,
    }
    assert TaskEvent.objects.filter(kind="epoch_fenced").count() == 2


def test_after_a_fence_the_old_holder_must_claim_again_and_then_commits(worker_a, ready_task, oncall):
    old = worker_a.claim(ready_task).json()
    oncall.post("/namespaces/default/fence", {"reason": "drill"})
    oncall.post("/namespaces/default/resume", {})

    new = worker_a.claim(ready_task, epoch=2).json()
    committed = worker_a.finish(new, {"v": 2})

    assert new["claim_generation"] == old["claim_generation"] + 1 and new["scheduler_epoch"] == 2
    assert committed.status_code == 200


# The contract's default protocol minimum is the rollout's ("legacy": old workers may still register); the core
# alone serves claim.v1 only and says so.
CORE_OR_ROLLOUT_DEFAULT_PROTOCOL = "legacy" if apps.is_installed("rollout") else "claim.v1"


def test_namespaces_are_created_listed_and_shown_with_their_drain(operator, worker_a):
    created = operator.post("/namespaces", {"name": "payments"})
    second = operator.post("/namespaces", {"name": "ledger"})
    duplicate = operator.post("/namespaces", {"name": "payments"})
    task_id = operator.create(namespace="payments").json()["task_id"]
    worker_a.claim(task_id)
    worker_a.claim_next(namespace="payments")

    shown = worker_a.get("/namespaces/payments").json()
    listed = worker_a.get("/namespaces").json()

    assert created.status_code == 201
    assert created.json() == {
        "name": "payments",
        "scheduler_epoch": 1,
        "claims_paused": False,
        "stage": "V1_ONLY",
        "min_protocol": CORE_OR_ROLLOUT_DEFAULT_PROTOCOL,
    }
    assert second.status_code == 201
    assert duplicate.status_code == 409 and duplicate.json()["outcome"] == "NAMESPACE_EXISTS"
    assert shown["drain"] == {"active_leases": 1, "unknown_effects": 0, "awaiting_commit": 0}
    assert [ns["name"] for ns in listed["results"]] == ["default", "ledger", "payments"]
    assert AuditEntry.objects.filter(action="namespace_create", principal="olivia-operator").count() == 2
