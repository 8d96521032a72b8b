"""A claim sent again with its Idempotency-Key (docs/workers.md, "Retrying a claim"; issue 39, point 4): a claim whose
answer was lost — a failover, a dropped connection — and that its worker sends again never leaves that worker two
live attempts. The records checked are the attempts and the key rows."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from claims import clock
from claims.models import Attempt, ClaimKey, Task
from claims.services.retention import history_prune
from tests.support.actors import make_actor
from tests.support.races import Pause, run_in_thread

pytestmark = pytest.mark.django_db(transaction=True)


def _keyed(actor, path: str, body: dict, key: str):
    return actor.client.post(f"/api/v1{path}", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def _next(actor, key: str, **fields):
    return _keyed(
        actor, "/claims", {"owner_id": actor.name, "scheduler_epoch": 1, "ttl_seconds": 30, **fields}, key
    )


def _live(owner: str) -> list[str]:
    return sorted(
        str(a) for a in Attempt.objects.filter(owner_id=owner, ended_at=None).values_list("pk", flat=True)
    )


def test_a_claim_next_sent_again_with_its_key_answers_the_same_grant(operator, worker_a):
    tasks = [operator.create().json()["task_id"] for _ in range(2)]

    lost = _next(worker_a, "k-1")  # granted; say its answer never reached the worker
    again = _next(worker_a, "k-1")

    assert lost.status_code == again.status_code == 200
    assert again.json() == lost.json()
    assert _live("worker-a") == [lost.json()["attempt_id"]]  # one attempt: the second task is still there
    assert Task.objects.get(pk=(set(tasks) - {lost.json()["task_id"]}).pop()).state == "READY"
    assert ClaimKey.objects.count() == 1


def test_without_a_key_the_same_request_takes_a_second_task(operator, worker_a):
    """What the key prevents: the repeat is a new request, and the worker now holds two tasks, one it never heard
    of (its lease runs out unused)."""
    for _ in range(2):
        operator.create()

    worker_a.claim_next(), worker_a.claim_next()

    assert len(_live("worker-a")) == 2
    assert not ClaimKey.objects.exists()


def test_a_batch_and_a_single_claim_sent_again_answer_their_grants(operator, worker_a):
    for _ in range(4):
        operator.create()
    body = {"owner_id": "worker-a", "scheduler_epoch": 1, "ttl_seconds": 30, "max_tasks": 2}
    batch = _keyed(worker_a, "/claims/batch", body, "b-1")
    batch_again = _keyed(worker_a, "/claims/batch", body, "b-1")
    ready = Task.objects.filter(state="READY").values_list("pk", flat=True).first()
    single = {"owner_id": "worker-a", "scheduler_epoch": 1, "ttl_seconds": 30}
    one = _keyed(worker_a, f"/tasks/{ready}/claim", single, "c-1")
    one_again = _keyed(worker_a, f"/tasks/{ready}/claim", single, "c-1")

    assert batch_again.json() == batch.json() and len(batch.json()["claims"]) == 2
    assert one.status_code == one_again.status_code == 200 and one_again.json() == one.json()
    granted = [c["attempt_id"] for c in batch.json()["claims"]] + [one.json()["attempt_id"]]
    assert _live("worker-a") == sorted(granted)
    unkeyed = worker_a.claim(
        ready
    )  # the same claim without its key: a new request, refused by the live lease
    assert (unkeyed.status_code, unkeyed.json()["reason"]) == (409, "LEASE_LIVE")


def test_the_key_answers_what_was_granted_even_after_the_grant_ended(operator, worker_a):
    """As a repeated commit answers its stored body whatever happened since: the worker learns the attempt it was
    given — and, renewing it, that it ended."""
    operator.create()
    granted = _next(worker_a, "k-2").json()
    assert worker_a.release(granted).status_code == 200

    again = _next(worker_a, "k-2")

    assert again.json() == granted
    renewed = worker_a.renew(granted)
    assert (renewed.status_code, renewed.json()["outcome"]) == (409, "FENCED")
    assert _live("worker-a") == []


def test_a_refusal_or_nothing_granted_keeps_no_key(operator, worker_a):
    stale = _next(worker_a, "k-3", scheduler_epoch=0)
    empty = _next(worker_a, "k-4")
    operator.create()
    granted = _next(worker_a, "k-4")  # the repeat of an empty answer may be granted

    assert (stale.status_code, stale.json()["outcome"]) == (409, "FENCED")
    assert empty.status_code == 204 and granted.status_code == 200
    assert list(ClaimKey.objects.values_list("key", flat=True)) == ["k-4"]


def test_a_key_sent_with_another_request_or_malformed_is_a_400_that_changes_nothing(operator, worker_a):
    for _ in range(2):
        operator.create()
    first = _next(worker_a, "k-5")

    other = _next(worker_a, "k-5", ttl_seconds=60)
    malformed = _next(worker_a, "x" * 201)
    control = _next(worker_a, "k\u00e9")

    assert first.status_code == 200
    for answer in (other, malformed, control):
        assert answer.status_code == 400 and "Idempotency-Key" in answer.json()["errors"], answer.json()
    assert _live("worker-a") == [first.json()["attempt_id"]]
    assert ClaimKey.objects.count() == 1


def test_keys_are_each_principals_own(operator, worker_a, worker_b):
    for _ in range(2):
        operator.create()

    a, b = _next(worker_a, "same"), _next(worker_b, "same")

    assert a.status_code == b.status_code == 200 and a.json()["task_id"] != b.json()["task_id"]
    assert ClaimKey.objects.count() == 2


def test_keys_older_than_their_retention_are_pruned(operator, worker_a, db_clock, settings):
    operator.create()
    _next(worker_a, "old")
    db_clock.travel(settings.CLAIM_KEY_RETENTION_SECONDS + 1)
    operator.create()
    _next(worker_a, "new")

    pruned = history_prune(budget_seconds=10)

    assert pruned.claim_keys == 1
    assert list(ClaimKey.objects.values_list("key", flat=True)) == ["new"]
    assert clock.now() > ClaimKey.objects.get().created_at


@pytest.mark.postgres
def test_two_copies_of_one_claim_in_flight_grant_once(operator):
    """The first copy looked for its key and found none; the second runs to its end meanwhile (granted, key
    kept); the first then inserts its key, waits on nothing (the second committed) and fails the unique
    constraint: it runs again and answers the second's grant — its own pick rolled back. (Without the second run
    the first answered a 500; without the constraint it granted a second task.)"""
    worker = make_actor("twice", "worker")
    for _ in range(2):
        operator.create()
    pause = Pause("claim_keys.looked")

    first, first_box = run_in_thread(lambda: _next(worker, "k-race"))
    pause.wait_reached()
    second = _next(worker, "k-race")
    pause.resume()
    first.join(30)

    assert "error" not in first_box, first_box
    assert first_box["value"].status_code == second.status_code == 200, first_box["value"].content
    assert first_box["value"].json() == second.json()
    assert _live("twice") == [second.json()["attempt_id"]]
    assert Task.objects.filter(state="READY").count() == 1


def test_the_openapi_schema_names_the_header(tmp_path):
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--file", str(out))
    schema = out.read_text()
    assert schema.count("Idempotency-Key") >= 3  # claim, claim-next, batch
