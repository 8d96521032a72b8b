"""Tasks (claim-v1.md §3): idempotent create, the operator's cancel, requeue and input revision, the timeline."""

from __future__ import annotations

import pytest

from claims.digest import digest
from claims.models import Attempt, AuditEntry, Task, TaskEvent


def test_create_makes_a_ready_task_with_the_contracts_fields(operator):
    response = operator.create(node_id="lint", input={"files": ["a.py"]}, task_id="run-1:lint")

    assert response.status_code == 201
    body = response.json()
    assert set(body) == {
        "task_id",
        "namespace",
        "node_id",
        "input",
        "input_digest",
        "depends_on",
        "replay_policy",
        "resources",
        "state",
        "state_version",
        "scheduler_epoch",
        "claim_generation",
        "attempt_id",
        "owner_id",
        "lease_expires_at",
        "cancel_generation",
        "result_commit_id",
        "result_digest",
        "result",
        "priority",  # claim-v1.md §10
        "fairness_key",
        "fairness_weight",
        "created_at",
        "updated_at",
    }
    assert (body["priority"], body["fairness_key"], body["fairness_weight"]) == (3, "", 1.0)
    assert body["input_digest"] == digest({"files": ["a.py"]})
    assert (body["state"], body["claim_generation"], body["namespace"]) == ("READY", 0, "default")
    assert Task.objects.filter(pk="run-1:lint").exists()


def test_creating_the_same_task_again_is_idempotent(operator):
    first = operator.create(node_id="n", input={"x": 1}, task_id="t-1")
    again = operator.create(node_id="n", input={"x": 1}, task_id="t-1")

    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json() == again.json()
    assert Task.objects.count() == 1 and TaskEvent.objects.filter(kind="task_created").count() == 1


def test_creating_an_existing_task_id_differently_is_task_exists(operator):
    operator.create(node_id="n", input={"x": 1}, task_id="t-1")

    response = operator.create(node_id="n", input={"x": 2}, task_id="t-1")

    assert response.status_code == 409 and response.json()["outcome"] == "TASK_EXISTS"
    assert Task.objects.get(pk="t-1").input == {"x": 1}


def test_a_worker_may_create_sub_tasks(worker_a):
    assert worker_a.create(node_id="sub").status_code == 201


def test_unknown_predecessors_namespaces_and_resources_are_field_errors(operator, default_namespace):
    deps = operator.create(depends_on=["nope"])
    namespace = operator.create(namespace="nowhere")
    resources = operator.create(resources=["db:orders"])

    assert deps.status_code == namespace.status_code == resources.status_code == 400
    assert "depends_on" in deps.json()["errors"]
    assert "namespace" in namespace.json()["errors"]
    assert "resources" in resources.json()["errors"]
    assert not Task.objects.exists()


def test_cancel_ends_the_attempt_and_moves_the_cancel_generation(operator, worker_a, ready_task):
    claim = worker_a.claim(ready_task).json()

    response = operator.post(f"/tasks/{ready_task}/cancel", {"reason": "superseded"})
    again = operator.post(f"/tasks/{ready_task}/cancel", {"reason": "twice"})

    assert response.status_code == 200
    assert (response.json()["state"], response.json()["cancel_generation"]) == ("CANCELLED", 1)
    assert again.status_code == 200 and again.json()["cancel_generation"] == 1
    assert Attempt.objects.get(pk=claim["attempt_id"]).end_reason == "CANCELLED"
    assert AuditEntry.objects.filter(action="task_cancel", principal="olivia-operator").count() == 1


def test_a_committed_task_cannot_be_cancelled_or_revised(operator, worker_a, ready_task):
    worker_a.finish(worker_a.claim(ready_task).json(), "final")

    cancel = operator.post(f"/tasks/{ready_task}/cancel", {"reason": "too late"})
    revise = operator.post(f"/tasks/{ready_task}/input", {"input": {"other": 1}})

    assert cancel.status_code == 409 and cancel.json()["outcome"] == "NOT_CANCELLABLE"
    assert revise.status_code == 409 and revise.json()["outcome"] == "NOT_REVISABLE"
    assert Task.objects.get(pk=ready_task).state == "COMMITTED"


def test_requeue_keeps_the_cancel_generation_so_old_attempts_stay_cancelled(operator, worker_a, ready_task):
    old = worker_a.claim(ready_task).json()
    worker_a.stage(old, "x")
    operator.post(f"/tasks/{ready_task}/cancel", {"reason": "oops"})

    requeued = operator.post(f"/tasks/{ready_task}/requeue")
    late = worker_a.commit(old, "x")
    new = worker_a.claim(ready_task).json()

    assert requeued.status_code == 200 and requeued.json()["state"] == "READY"
    assert late.status_code == 409 and late.json()["outcome"] == "CANCELLED"
    assert new["cancel_generation"] == 1 and worker_a.finish(new, "y").status_code == 200


def test_requeue_of_a_task_that_is_not_cancelled_is_an_invalid_transition(operator, ready_task):
    response = operator.post(f"/tasks/{ready_task}/requeue")

    assert response.status_code == 409 and response.json()["outcome"] == "INVALID_TRANSITION"


def test_the_timeline_lists_every_transition_oldest_first_without_payloads(operator, worker_a, ready_task):
    claim = worker_a.claim(ready_task).json()
    worker_a.renew(claim)
    worker_a.finish(claim, {"secret-ish": "payload"})

    events = worker_a.get(f"/tasks/{ready_task}/events").json()

    assert [e["kind"] for e in events["results"]] == [
        "task_created",
        "claimed",
        "renewed",
        "result_staged",
        "result_committed",
    ]
    assert set(events["results"][1]) == {
        "kind",
        "at",
        "attempt_id",
        "claim_generation",
        "scheduler_epoch",
        "owner_id",
        "principal",
        "detail",
    }
    assert "payload" not in str(events)


def test_the_frontier_is_the_ready_list(operator, worker_a):
    ready = operator.create().json()["task_id"]
    claimed = operator.create().json()["task_id"]
    worker_a.claim(claimed)

    frontier = worker_a.get("/tasks", state="READY", namespace="default").json()

    assert frontier["count"] == 1 and [t["task_id"] for t in frontier["results"]] == [ready]


def test_the_timeline_and_audit_log_refuse_updates_in_the_database(operator, ready_task):
    from django.db import DatabaseError, transaction

    from claims.models import AuditEntry

    operator.post(f"/tasks/{ready_task}/cancel", {"reason": "x"})

    with pytest.raises(DatabaseError), transaction.atomic():
        TaskEvent.objects.filter(task_id=ready_task).update(principal="someone-else")
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditEntry.objects.update(principal="someone-else")
    assert set(TaskEvent.objects.values_list("principal", flat=True)) == {"olivia-operator"}
