"""Bad input of every shape is a 400 (or the idempotent answer) and changes nothing — never a 500: bodies nested
hundreds of levels deep, lone surrogates in any field, query parameters no pool could have, and two identical
creates at once."""

from __future__ import annotations

import json

import pytest

from claims.digest import digest
from claims.models import AuditEntry, Effect, StagedResult, Task, TaskEvent
from tests.support.actors import make_actor
from tests.support.races import Pause, run_in_thread, wait_done_or_waiting


def nested(levels: int):
    value: object = "leaf"
    for _ in range(levels):
        value = {"k": value}
    return value


def raw(actor, path: str, text: str):
    return actor.client.post(f"/api/v1{path}", data=text.encode("utf-8"), content_type="application/json")


@pytest.mark.parametrize("levels", [130, 400, 650, 900])
def test_values_nested_hundreds_of_levels_deep_are_400(operator, worker_a, ready_task, levels):
    claim = worker_a.claim(ready_task).json()
    deep = nested(levels)
    created = operator.create(input=deep)
    staged = worker_a.stage(claim, {"r": deep}, result_digest=digest({"r": "x"}))
    prepared = worker_a.prepare(claim, "slot", {"p": 1})
    effect_id = prepared.json()["effect_id"]
    dispatched = worker_a.dispatch(claim, effect_id, deep, "http://127.0.0.1:9/x")

    for response in (created, staged, dispatched):
        assert response.status_code == 400, response.content[:300]
        assert response.json()["outcome"] == "INVALID"
    assert Task.objects.count() == 1 and not StagedResult.objects.exists()
    assert Effect.objects.get(pk=effect_id).dispatched_at is None


def test_nesting_up_to_the_bound_is_accepted(operator):
    response = operator.create(input=nested(100))

    assert response.status_code == 201, response.content[:300]


LONE = '"\\ud800"'  # JSON's escape for a lone surrogate: valid JSON text, not valid Unicode


@pytest.mark.parametrize(
    ("path", "template"),
    [
        ("/tasks", '{"node_id": "n", "input": {}, "replay_policy": %s}'),
        ("/tasks", '{"node_id": %s, "input": {}}'),
        ("/tasks", '{"node_id": "n", "input": {"text": %s}}'),
        ("/tasks", '{"node_id": "n", "input": {%s: 1}}'),
        ("/namespaces", '{"name": "x", "stage": %s}'),
        ("/namespaces/default/fence", '{"reason": %s}'),
    ],
)
def test_a_lone_surrogate_in_any_field_is_400(oncall, default_namespace, path, template):
    before = (Task.objects.count(), AuditEntry.objects.count(), TaskEvent.objects.count())

    response = raw(oncall, path, template % LONE)

    assert response.status_code == 400, response.content[:300]
    assert response.json()["outcome"] == "INVALID"
    assert (Task.objects.count(), AuditEntry.objects.count(), TaskEvent.objects.count()) == before


def test_a_lone_surrogate_in_a_worker_choice_field_is_400(worker_a, ready_task):
    claim = worker_a.claim(ready_task).json()
    key = worker_a.prepare(claim, "slot", {"p": 1}).json()["effect_id"]
    attempt = json.dumps(
        {k: claim[k] for k in ("attempt_id", "claim_generation", "scheduler_epoch")}
        | {"owner_id": "worker-a"}
    )[1:-1]

    outcome = raw(worker_a, f"/effects/{key}/outcome", '{"state": ' + LONE + ", " + attempt + "}")
    reconcile = raw(worker_a, f"/effects/{key}/reconcile", '{"observed": ' + LONE + ", " + attempt + "}")

    assert outcome.status_code == reconcile.status_code == 400
    assert Effect.objects.get(pk=key).state == "PREPARED"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_identical_creates_at_once_answer_201_and_the_idempotent_200(default_namespace):
    operator = make_actor("creator", "operator")
    body = {"task_id": "twice", "node_id": "n", "input": {"x": 1}}
    pause = Pause("task_create.checked")

    first, first_box = run_in_thread(lambda: operator.post("/tasks", body))
    pause.wait_reached()  # the first create checked that the id is free, and has not inserted yet
    second, second_box = run_in_thread(lambda: operator.post("/tasks", body))
    wait_done_or_waiting(second_box, 1)
    pause.resume()
    first.join(30)
    second.join(30)

    statuses = sorted([first_box["value"].status_code, second_box["value"].status_code])
    assert statuses == [200, 201], [first_box["value"].content, second_box["value"].content]
    assert Task.objects.filter(pk="twice").count() == 1
    assert TaskEvent.objects.filter(task_id="twice", kind="task_created").count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_create_racing_a_different_definition_of_the_same_id_is_task_exists(default_namespace):
    operator = make_actor("creator", "operator")
    pause = Pause("task_create.checked")

    first, first_box = run_in_thread(
        lambda: operator.post("/tasks", {"task_id": "clash", "node_id": "a", "input": {}})
    )
    pause.wait_reached()
    second, second_box = run_in_thread(
        lambda: operator.post("/tasks", {"task_id": "clash", "node_id": "b", "input": {}})
    )
    wait_done_or_waiting(second_box, 1)
    pause.resume()
    first.join(30)
    second.join(30)

    answers = sorted([first_box["value"].status_code, second_box["value"].status_code])
    assert answers == [201, 409]
    assert Task.objects.filter(pk="clash").count() == 1
