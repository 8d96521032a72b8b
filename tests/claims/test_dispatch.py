"""The dispatch gateway (claim-v1.md §6): a durable intent recorded with its checks, delivered by a Celery job
with the effect's key; a lost reply is UNKNOWN; the recorded order decides races with cancel (A9, A13, A19)."""

from __future__ import annotations

import pytest

from claims.models import DispatchIntent, Effect, Task
from claims.services import dispatch_deliver
from tests.support.actors import make_actor
from tests.support.races import Pause, run_in_thread, wait_for_lock_waiters


@pytest.fixture
def claim_a(worker_a, ready_task):
    return worker_a.claim(ready_task, ttl=30).json()


def _prepare(worker, claim, slot="deploy", payload=None):
    return worker.prepare(claim, slot, payload if payload is not None else {"service": "api"}).json()[
        "effect_id"
    ]


def test_a_dispatch_is_delivered_once_with_the_effects_key_generation_and_fences(
    worker_a, claim_a, effect_target, django_capture_on_commit_callbacks
):
    key = _prepare(worker_a, claim_a)

    with django_capture_on_commit_callbacks(execute=True):
        response = worker_a.dispatch(claim_a, key, {"service": "api"}, effect_target.url + "/deploy")

    assert response.status_code == 201 and response.json()["outcome"] == "DISPATCH_RECORDED"
    assert effect_target.count(key) == 1
    call = effect_target.calls[key][0]
    assert call["payload"] == {"service": "api"} and call["generation"] == str(claim_a["claim_generation"])
    effect = Effect.objects.get(pk=key)
    assert (effect.state, effect.external_ref) == ("COMMITTED", "201")
    assert DispatchIntent.objects.get().state == "DELIVERED"


@pytest.mark.parametrize(("mode", "state"), [("refuse", "FAILED"), ("error", "UNKNOWN"), ("slow", "UNKNOWN")])
def test_a_refusal_is_failed_and_a_5xx_or_timeout_is_unknown(
    worker_a, claim_a, effect_target, django_capture_on_commit_callbacks, mode, state
):
    key = _prepare(worker_a, claim_a)
    effect_target.mode = mode

    with django_capture_on_commit_callbacks(execute=True):
        worker_a.dispatch(claim_a, key, {"service": "api"}, effect_target.url + "/deploy")

    assert Effect.objects.get(pk=key).state == state
    assert effect_target.count(key) == 1


def test_dispatch_checks_the_payload_state_and_target(worker_a, claim_a, effect_target):
    key = _prepare(worker_a, claim_a)

    wrong_payload = worker_a.dispatch(claim_a, key, {"service": "db"}, effect_target.url)
    off_list = worker_a.dispatch(claim_a, key, {"service": "api"}, "http://example.com/hook")
    not_http = worker_a.dispatch(claim_a, key, {"service": "api"}, "file:///etc/passwd")
    worker_a.outcome(claim_a, key, "UNKNOWN")
    unknown = worker_a.dispatch(claim_a, key, {"service": "api"}, effect_target.url)

    assert wrong_payload.json()["outcome"] == "PAYLOAD_CONFLICT"
    assert off_list.status_code == 400 and "target" in off_list.json()["errors"]
    assert not_http.status_code == 400
    assert unknown.json()["outcome"] == "INVALID_TRANSITION"  # reconcile first: nothing re-sends from UNKNOWN
    assert not DispatchIntent.objects.exists() and effect_target.count() == 0


def test_a_repeat_while_in_flight_returns_the_same_intent(worker_a, claim_a, effect_target):
    key = _prepare(worker_a, claim_a)

    first = worker_a.dispatch(claim_a, key, {"service": "api"}, effect_target.url)  # delivery not run yet
    again = worker_a.dispatch(claim_a, key, {"service": "api"}, effect_target.url)

    assert first.json()["dispatch_id"] == again.json()["dispatch_id"]
    assert DispatchIntent.objects.count() == 1


def test_a9_the_target_acted_but_the_reply_was_lost_and_recovery_resolves_the_original(
    worker_a, worker_b, claim_a, ready_task, effect_target, django_capture_on_commit_callbacks, db_clock
):
    key = _prepare(worker_a, claim_a)
    effect_target.mode = "drop_reply"
    with django_capture_on_commit_callbacks(execute=True):
        worker_a.dispatch(claim_a, key, {"service": "api"}, effect_target.url + "/deploy")
    assert Effect.objects.get(pk=key).state == "UNKNOWN"
    db_clock.travel(31)
    claim_b = worker_b.claim(ready_task).json()
    effect_target.mode = "ok"

    told = worker_b.prepare(claim_b, "deploy", {"service": "api"}).json()["outcome"]
    redispatch = worker_b.dispatch(claim_b, key, {"service": "api"}, effect_target.url + "/deploy")
    worker_b.reconcile(claim_b, key, "OCCURRED")

    assert told == "RECONCILE_REQUIRED"
    assert redispatch.json()["outcome"] == "INVALID_TRANSITION"
    assert Effect.objects.get(pk=key).state == "COMMITTED"
    assert effect_target.count() == 1 and effect_target.count(key) == 1  # no second call, under no other key


def test_a_not_occurred_reconcile_allows_a_new_dispatch_under_the_same_key(
    worker_a, claim_a, effect_target, django_capture_on_commit_callbacks
):
    key = _prepare(worker_a, claim_a)
    effect_target.mode = "error"
    with django_capture_on_commit_callbacks(execute=True):
        worker_a.dispatch(claim_a, key, {"service": "api"}, effect_target.url)
    worker_a.reconcile(claim_a, key, "NOT_OCCURRED")
    effect_target.mode = "ok"

    with django_capture_on_commit_callbacks(execute=True):
        worker_a.dispatch(claim_a, key, {"service": "api"}, effect_target.url)

    assert Effect.objects.get(pk=key).state == "COMMITTED"
    assert list(effect_target.calls) == [key] and effect_target.count(key) == 2


def test_while_a_dispatch_is_in_flight_its_delivery_alone_records_the_outcome(
    worker_a, claim_a, effect_target
):
    key = _prepare(worker_a, claim_a)
    intent_id = worker_a.dispatch(claim_a, key, {"service": "api"}, effect_target.url).json()["dispatch_id"]

    guessed = worker_a.outcome(claim_a, key, "UNKNOWN")  # before the job ran: the worker cannot know
    delivery = dispatch_deliver(dispatch_id=intent_id)
    twice = dispatch_deliver(dispatch_id=intent_id)

    assert guessed.status_code == 409
    assert (guessed.json()["outcome"], guessed.json()["reason"]) == (
        "INVALID_TRANSITION",
        "DISPATCH_IN_FLIGHT",
    )
    assert (delivery.sent, delivery.outcome) == (True, "COMMITTED")
    assert twice.outcome == "NOT_TAKEN"
    assert DispatchIntent.objects.get().state == "DELIVERED" and effect_target.count() == 1
    assert Effect.objects.get(pk=key).state == "COMMITTED"


def test_a19_a_non_replayable_effect_waits_for_approval_runs_once_and_is_never_replayed(
    operator, worker_a, worker_b, effect_target, django_capture_on_commit_callbacks, db_clock
):
    task_id = operator.create(node_id="migrate-db", replay_policy="NON_REPLAYABLE").json()["task_id"]
    claim_a = worker_a.claim(task_id, ttl=30).json()

    prepared = worker_a.prepare(claim_a, "migrate", {"to": "v2"})
    key = prepared.json()["effect_id"]
    early = worker_a.dispatch(claim_a, key, {"to": "v2"}, effect_target.url)
    approved = operator.post(f"/effects/{key}/approve", {"note": "change #88 reviewed"})
    approved_again = operator.post(f"/effects/{key}/approve", {})
    with django_capture_on_commit_callbacks(execute=True):
        ran = worker_a.dispatch(claim_a, key, {"to": "v2"}, effect_target.url)
    db_clock.travel(31)  # takeover
    claim_b = worker_b.claim(task_id).json()
    replay = worker_b.prepare(claim_b, "migrate", {"to": "v2"})
    replay_dispatch = worker_b.dispatch(claim_b, key, {"to": "v2"}, effect_target.url)

    assert prepared.status_code == 202 and prepared.json()["outcome"] == "APPROVAL_REQUIRED"
    assert early.json()["outcome"] == "APPROVAL_REQUIRED"
    assert approved.json() == approved_again.json() == {"outcome": "APPROVED"}
    assert ran.status_code == 201
    assert replay.json()["outcome"] == "ALREADY_COMMITTED"
    assert replay_dispatch.json()["outcome"] == "INVALID_TRANSITION"
    assert effect_target.count(key) == 1 and effect_target.count() == 1
    assert Effect.objects.get(pk=key).approved_by == "olivia-operator"


def test_a19_non_replayable_effects_of_one_node_run_one_at_a_time(operator, worker_a, effect_target):
    task_id = operator.create(node_id="migrate-db", replay_policy="NON_REPLAYABLE").json()["task_id"]
    claim = worker_a.claim(task_id).json()
    first = worker_a.prepare(claim, "step-1", 1).json()["effect_id"]
    second = worker_a.prepare(claim, "step-2", 2).json()["effect_id"]
    for key in (first, second):
        operator.post(f"/effects/{key}/approve", {})
    worker_a.dispatch(claim, first, 1, effect_target.url)  # recorded, not yet delivered

    busy = worker_a.dispatch(claim, second, 2, effect_target.url)

    assert (busy.json()["outcome"], busy.json()["reason"]) == ("INVALID_TRANSITION", "NODE_BUSY")


def test_approving_a_replayable_or_committed_effect_is_an_invalid_transition(operator, worker_a, claim_a):
    key = _prepare(worker_a, claim_a)

    response = operator.post(f"/effects/{key}/approve", {})

    assert response.status_code == 409 and response.json()["outcome"] == "INVALID_TRANSITION"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a13_dispatch_recorded_before_cancel_is_still_delivered(operator, ready_task, effect_target):
    worker = make_actor("dispatcher", "worker")
    claim = worker.claim(ready_task, ttl=30).json()
    key = _prepare(worker, claim)
    pause = Pause("effect_dispatch.checked")

    dispatching, dispatch_box = run_in_thread(
        lambda: worker.dispatch(claim, key, {"service": "api"}, effect_target.url)
    )
    pause.wait_reached()  # the dispatch holds the task row, its checks passed
    cancelling, cancel_box = run_in_thread(
        lambda: operator.post(f"/tasks/{ready_task}/cancel", {"reason": "race"})
    )
    wait_for_lock_waiters(1)
    pause.resume()
    dispatching.join(30)
    cancelling.join(30)

    assert dispatch_box["value"].status_code == 201 and cancel_box["value"].status_code == 200
    assert Task.objects.get(pk=ready_task).state == "CANCELLED"
    # The commitment was recorded first, so delivery remains allowed (eager Celery ran it on commit).
    assert Effect.objects.get(pk=key).state == "COMMITTED" and effect_target.count(key) == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a13_cancel_recorded_before_dispatch_refuses_it(operator, ready_task, effect_target):
    worker = make_actor("dispatcher", "worker")
    claim = worker.claim(ready_task, ttl=30).json()
    key = _prepare(worker, claim)
    pause = Pause("task_cancel.locked")

    cancelling, cancel_box = run_in_thread(
        lambda: operator.post(f"/tasks/{ready_task}/cancel", {"reason": "race"})
    )
    pause.wait_reached()
    dispatching, dispatch_box = run_in_thread(
        lambda: worker.dispatch(claim, key, {"service": "api"}, effect_target.url)
    )
    wait_for_lock_waiters(1)
    pause.resume()
    cancelling.join(30)
    dispatching.join(30)

    assert cancel_box["value"].status_code == 200
    assert dispatch_box["value"].status_code == 409 and dispatch_box["value"].json()["outcome"] == "CANCELLED"
    assert not DispatchIntent.objects.exists() and effect_target.count() == 0


def test_a_delivery_whose_worker_died_mid_send_is_sent_again_under_the_same_key(
    worker_a, claim_a, effect_target, db_clock
):
    from claims.models import DispatchIntent as Intent
    from claims.tasks import redeliver_dispatches

    key = _prepare(worker_a, claim_a)
    dispatch_id = worker_a.dispatch(claim_a, key, {"service": "api"}, effect_target.url).json()["dispatch_id"]
    # A worker took it and died before recording the reply (it had already reached the target once).
    Intent.objects.filter(pk=dispatch_id).update(state="SENDING", sending_at=db_clock.now())
    effect_target.calls[key].append({"payload": {"service": "api"}, "generation": "1", "fences": []})
    assert redeliver_dispatches.delay().get() == {"redelivered": 0}  # not stuck yet
    db_clock.travel(121)

    result = redeliver_dispatches.delay().get()

    assert result == {"redelivered": 1}
    assert Effect.objects.get(pk=key).state == "COMMITTED"
    assert list(effect_target.calls) == [key] and effect_target.count(key) == 2  # the same key, both times
    assert Intent.objects.get(pk=dispatch_id).deliveries == 1
