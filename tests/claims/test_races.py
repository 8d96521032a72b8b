"""Stale authority refused in every interleaving (acceptance.md A21–A23): each test pauses one party at the racing
boundary — holding what its transaction holds — lets the competitor run to its end or to its lock wait, resumes,
and then reads the authoritative rows. The rule they prove: a decision is made on values read under the lock the
write takes (or carried in the write's WHERE), on a clock read after the locks are held."""

from __future__ import annotations

import threading

import pytest

from claims.models import Attempt, DispatchIntent, Effect, EffectEvent, Resource, ResourceKey, Task, TaskEvent
from tests.support.actors import make_actor
from tests.support.processes import wait_for
from tests.support.races import Pause, row_locked, run_in_thread, wait_done_or_waiting, wait_for_lock_waiters

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _holding(response) -> bool:
    return response.status_code == 200 and response.json()["outcome"] in ("CLAIMED", "RENEWED")


# --- A21: a renew at the lease's last moment against a claim that read the lease as expired ----------------


def test_a21_a_renew_that_decided_first_is_not_overridden_by_a_claim_that_read_the_lease_as_expired(
    operator, db_clock
):
    worker_a, worker_b = make_actor("renewer", "worker"), make_actor("taker", "worker")
    task_id = operator.create().json()["task_id"]
    claim = worker_a.claim(task_id, ttl=5).json()
    pause = Pause("task_renew.checked")

    renewing, renew_box = run_in_thread(lambda: worker_a.renew(claim, extend=30))
    pause.wait_reached()  # A's renew judged its lease live and holds the task row
    db_clock.travel(6)  # the lease's last moment has passed for anyone reading the clock from now on
    claiming, claim_box = run_in_thread(lambda: worker_b.claim(task_id, ttl=30))
    wait_done_or_waiting(claim_box, 1)
    pause.resume()
    renewing.join(30)
    claiming.join(30)

    renew, taken = renew_box["value"], claim_box["value"]
    assert not (_holding(renew) and _holding(taken)), (renew.json(), taken.json())
    task = Task.objects.get(pk=task_id)
    assert renew.status_code == 200 and renew.json()["outcome"] == "RENEWED"
    assert taken.status_code == 409 and taken.json()["reason"] == "LEASE_LIVE"
    assert (str(task.attempt_id), task.owner_id, task.claim_generation) == (claim["attempt_id"], "renewer", 1)
    assert Attempt.objects.filter(task_id=task_id).count() == 1


def test_a21_a_claim_that_decided_first_makes_the_late_renew_refused(operator, db_clock):
    worker_a, worker_b = make_actor("renewer", "worker"), make_actor("taker", "worker")
    task_id = operator.create().json()["task_id"]
    claim = worker_a.claim(task_id, ttl=5).json()
    db_clock.travel(6)
    pause = Pause("task_claim.read")

    claiming, claim_box = run_in_thread(lambda: worker_b.claim(task_id, ttl=30))
    pause.wait_reached()  # B's claim has read the lease as expired
    # A's renew was sent at its lease's last moment: its clock reading is still inside the lease.
    db_clock.travel(-2)
    renewing, renew_box = run_in_thread(lambda: worker_a.renew(claim, extend=30))
    wait_done_or_waiting(renew_box, 1)
    db_clock.travel(2)
    pause.resume()
    claiming.join(30)
    renewing.join(30)

    renew, taken = renew_box["value"], claim_box["value"]
    assert not (_holding(renew) and _holding(taken)), (renew.json(), taken.json())
    task = Task.objects.get(pk=task_id)
    if _holding(taken):
        assert renew.status_code == 409 and renew.json()["outcome"] in ("FENCED", "EXPIRED")
        assert (str(task.attempt_id), task.claim_generation) == (taken.json()["attempt_id"], 2)
    else:
        assert (str(task.attempt_id), task.claim_generation) == (claim["attempt_id"], 1)


# --- A22: a commit carrying an old resource token while the resource row is held ---------------------------


def test_a22_a_commit_with_an_old_resource_token_is_refused_after_another_task_took_the_resource(
    operator, db_clock
):
    worker_a, worker_b = make_actor("first", "worker"), make_actor("second", "worker")
    doc = operator.post("/resources", {"resource_key": "doc:1"}).json()
    t1 = operator.create(node_id="edit-1", resources=["doc:1"]).json()["task_id"]
    t2 = operator.create(node_id="edit-2", resources=["doc:1"]).json()["task_id"]
    claim = worker_a.claim(t1, ttl=5).json()
    assert claim["fences"] == {"doc:1": 1}
    worker_a.stage(claim, {"text": "a"})
    named = [{"resource_key": "doc:1", "incarnation": doc["incarnation"], "expected_revision": 0}]

    with row_locked("SELECT 1 FROM claims_resource WHERE key_id = %s FOR UPDATE", ["doc:1"]):
        committing, commit_box = run_in_thread(lambda: worker_a.commit(claim, {"text": "a"}, resources=named))
        wait_for_lock_waiters(1)  # T1's commit waits on the resource row
        db_clock.travel(6)  # meanwhile T1's lease runs out
        claiming, claim_box = run_in_thread(lambda: worker_b.claim(t2, ttl=30))
        wait_done_or_waiting(claim_box, 2)
    committing.join(30)
    claiming.join(30)

    commit, taken = commit_box["value"], claim_box["value"]
    assert commit.status_code == 409, commit.json()
    assert (commit.json()["outcome"], commit.json()["reason"]) in (
        ("FENCED", "LEASE_EXPIRED"),
        ("STALE_INPUT", "RESOURCE"),
    )
    assert taken.status_code == 200 and taken.json()["fences"] == {"doc:1": 2}
    assert Task.objects.get(pk=t1).state == "CLAIMED" and Task.objects.get(pk=t1).result is None
    assert Resource.objects.get(key_id="doc:1", deleted_at__isnull=True).revision == 0


def test_a22_a_dispatch_never_lands_after_another_task_took_the_resource(operator, db_clock, effect_target):
    worker_a, worker_b = make_actor("first", "worker"), make_actor("second", "worker")
    operator.post("/resources", {"resource_key": "doc:2"})
    t1 = operator.create(node_id="publish-1", resources=["doc:2"]).json()["task_id"]
    t2 = operator.create(node_id="publish-2", resources=["doc:2"]).json()["task_id"]
    claim = worker_a.claim(t1, ttl=5).json()
    effect_id = worker_a.prepare(claim, "post", {"n": 1}).json()["effect_id"]
    pause = Pause("effect_dispatch.checked")

    dispatching, box = run_in_thread(
        lambda: worker_a.dispatch(claim, effect_id, {"n": 1}, effect_target.url + "/post")
    )
    pause.wait_reached()  # the dispatch has checked authority and the resource's token
    db_clock.travel(6)  # T1's lease runs out: another task may now take the resource
    claiming, claim_box = run_in_thread(lambda: worker_b.claim(t2, ttl=30))
    wait_done_or_waiting(claim_box, 1)
    taken_while_paused = bool(claim_box)
    pause.resume()
    dispatching.join(30)
    claiming.join(30)

    dispatched = box["value"]
    assert claim_box["value"].status_code == 200 and claim_box["value"].json()["fences"] == {"doc:2": 2}
    # Either the dispatch was recorded while T1 still held the resource (the claim waited for it), or it is
    # refused: never a dispatch recorded after the resource's newer token was taken.
    assert not (taken_while_paused and dispatched.status_code == 201), dispatched.json()
    intents = list(DispatchIntent.objects.all())
    assert all(intent.fence_headers == {"doc:2": 1} for intent in intents)
    if taken_while_paused:
        assert dispatched.status_code == 409 and not intents


# --- A23: a fenced attempt's late outcome report while the replacement's delivery is in flight -----------


def test_a23_a_fenced_attempts_late_report_cannot_move_the_effect_off_the_replacements_dispatch(
    operator, db_clock, effect_target
):
    worker_a, worker_b = make_actor("first", "worker"), make_actor("second", "worker")
    task_id = operator.create(node_id="notify").json()["task_id"]
    claim_a = worker_a.claim(task_id, ttl=5).json()
    payload = {"to": "ops"}
    effect_id = worker_a.prepare(claim_a, "mail", payload).json()["effect_id"]
    # A's delivery never reaches the target (nothing listens there): UNKNOWN, and the target did not act.
    worker_a.dispatch(claim_a, effect_id, payload, "http://127.0.0.1:9/mail")
    assert Effect.objects.get(pk=effect_id).state == "UNKNOWN"
    db_clock.travel(6)
    claim_b = worker_b.claim(task_id, ttl=60).json()
    assert worker_b.reconcile(claim_b, effect_id, "NOT_OCCURRED").status_code == 200
    hold = threading.Event()
    effect_target.holds["/mail"] = hold

    dispatching, box = run_in_thread(
        lambda: worker_b.dispatch(claim_b, effect_id, payload, effect_target.url + "/mail")
    )
    assert wait_for(
        lambda: effect_target.count(effect_id) == 1, seconds=20
    )  # B's call is at the target, no reply yet
    late = worker_a.outcome(claim_a, effect_id, "FAILED")
    hold.set()
    dispatching.join(30)
    again = worker_b.prepare(claim_b, "mail", payload)
    if again.json().get("outcome") == "PREPARED":
        worker_b.dispatch(claim_b, effect_id, payload, effect_target.url + "/mail")

    assert late.status_code == 409 and late.json()["outcome"] == "FENCED", late.json()
    assert box["value"].status_code == 201
    assert Effect.objects.get(pk=effect_id).state == "COMMITTED"
    assert again.json()["outcome"] == "ALREADY_COMMITTED"
    assert effect_target.count(effect_id) == 1
    assert not EffectEvent.objects.filter(effect_id=effect_id, to_state="FAILED").exists()


def test_a23_the_attempt_that_dispatched_may_still_report_while_nobody_moved_the_effect_since(
    operator, db_clock
):
    worker_a, worker_b = make_actor("first", "worker"), make_actor("second", "worker")
    task_id = operator.create(node_id="notify").json()["task_id"]
    claim_a = worker_a.claim(task_id, ttl=5).json()
    effect_id = worker_a.prepare(claim_a, "mail", {"to": "ops"}).json()["effect_id"]
    db_clock.travel(6)
    worker_b.claim(task_id, ttl=60)

    report = worker_a.outcome(claim_a, effect_id, "COMMITTED", external_ref="msg-1")

    assert report.status_code == 200, report.json()
    assert Effect.objects.get(pk=effect_id).state == "COMMITTED"


# --- a renew of a task with resources against a claim of another task on the same resource ---------------


def test_a_renew_and_another_tasks_claim_of_its_resource_are_never_both_answered_as_holding(
    operator, db_clock
):
    worker_a, worker_b = make_actor("first", "worker"), make_actor("second", "worker")
    operator.post("/resources", {"resource_key": "doc:3"})
    t1 = operator.create(node_id="edit-1", resources=["doc:3"]).json()["task_id"]
    t2 = operator.create(node_id="edit-2", resources=["doc:3"]).json()["task_id"]
    claim = worker_a.claim(t1, ttl=5).json()
    pause = Pause("task_renew.checked")

    renewing, renew_box = run_in_thread(lambda: worker_a.renew(claim, extend=30))
    pause.wait_reached()  # T1's renew judged its lease live and holds T1's row
    db_clock.travel(6)  # for a claim reading T1's row from now on, T1's lease has run out
    claiming, claim_box = run_in_thread(lambda: worker_b.claim(t2, ttl=30))
    wait_done_or_waiting(claim_box, 1)
    pause.resume()
    renewing.join(30)
    claiming.join(30)

    renew, taken = renew_box["value"], claim_box["value"]
    assert not (_holding(renew) and _holding(taken)), (renew.json(), taken.json())
    assert renew.status_code == 200 and renew.json()["outcome"] == "RENEWED"
    assert taken.status_code == 409 and taken.json()["reason"] == "RESOURCE_HELD"
    key = ResourceKey.objects.get(pk="doc:3")
    assert (key.fence_token, str(key.holder_attempt_id)) == (1, claim["attempt_id"])


# --- reaping against a renew ----------------------------------------------------------------------------------


def test_reaping_never_records_a_lease_expired_for_a_lease_renewed_meanwhile(operator, db_clock):
    from claims.services import leases_reap

    worker = make_actor("renewer", "worker")
    task_id = operator.create().json()["task_id"]
    claim = worker.claim(task_id, ttl=5).json()
    pause = Pause("task_renew.checked")

    renewing, renew_box = run_in_thread(lambda: worker.renew(claim, extend=30))
    pause.wait_reached()  # the renew judged the lease live and holds the task row
    db_clock.travel(6)  # the reaper's clock says the lease ran out
    reaping, reap_box = run_in_thread(leases_reap)
    wait_done_or_waiting(reap_box, 1)
    pause.resume()
    renewing.join(30)
    reaping.join(30)

    assert renew_box["value"].status_code == 200 and renew_box["value"].json()["outcome"] == "RENEWED"
    assert not TaskEvent.objects.filter(task_id=task_id, kind="lease_expired").exists()
