"""Celery worker processes killed with SIGKILL in the middle of the jobs that must be neither lost nor doubled:
``fence_epoch`` (inside its self-check, and inside the fence of a request an earlier release left unfenced), ``advance_rollback`` (between moving the stage and marking
the rollback done) and ``deliver_dispatch`` (while the target is acting). Real worker processes on Redis, real
PostgreSQL; the job is stopped at the chosen point by a row lock this test holds on another connection (a real
database wait, not a hook in the product), the worker is killed there, and a fresh worker picks the work up
through the periodic job beat would send (``resend_fences``, ``advance_rollback``, ``redeliver_dispatches``).

Redis keeps a killed worker's unacknowledged message for its visibility timeout (an hour by default), so
recovery never waits on the broker: every job's state is in the database, and the periodic jobs find what is
unfinished.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection

from claims import clock
from claims.models import AuditEntry, DispatchIntent, Effect, Namespace, Principal
from claims.tasks import deliver_dispatch, redeliver_dispatches
from oncall import services as fences
from oncall.models import FenceRequest
from oncall.tasks import fence_epoch, resend_fences
from rollout.models import Rollback, StageChange
from rollout.tasks import advance_rollback
from tests.support.actors import make_actor
from tests.support.processes import FAST_RESEND_ENV, wait_for
from tests.support.races import row_locked, wait_for_lock_waiters
from tests.support.rollout import stage_of

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def wait_until_no_backend_holds_an_advisory_lock() -> None:
    """A killed worker's backend lingers until PostgreSQL notices the closed socket; its session locks go with
    it."""

    def gone():
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted")
            return cursor.fetchone()[0] == 0

    assert wait_for(gone, seconds=20)


def test_a_request_recorded_before_its_fence_by_an_earlier_release_is_fenced_once_by_its_job(celery_workers):
    """Before issue 24 the console recorded a request and left the fence to its job. A request left so by an
    upgrade (no epoch yet) is fenced by the job that checks it — once, though its first worker is killed inside
    the fence's transaction."""
    operator, oncall = make_actor("olivia-operator", "operator"), make_actor("oscar-oncall", "oncall")
    operator.create(node_id="probe")
    first = celery_workers.start(**FAST_RESEND_ENV)
    request = FenceRequest.objects.create(
        namespace="default", reason="drill", principal=oncall.name, requested_at=clock.now()
    )

    with row_locked("SELECT 1 FROM claims_namespace WHERE name = %s FOR UPDATE", ["default"]):
        fence_epoch.delay("default", "drill", oncall.name, str(request.pk))
        wait_for_lock_waiters(1)  # the job is inside the fence's transaction, waiting for the namespace row
        celery_workers.kill(first)

    namespace = Namespace.objects.get(name="default")
    assert (namespace.scheduler_epoch, namespace.claims_paused) == (1, False)  # nothing of it committed
    assert FenceRequest.objects.get().status == "PENDING"

    celery_workers.start(**FAST_RESEND_ENV)
    wait_until_no_backend_holds_an_advisory_lock()
    time.sleep(1.1)  # older than FENCE_RESEND_AFTER_SECONDS
    resend_fences.delay()

    assert wait_for(lambda: FenceRequest.objects.get().finished_at is not None), celery_workers.log()
    done = FenceRequest.objects.get()
    assert (done.status, done.scheduler_epoch, done.runs) == ("CHECKED", 2, 2)
    namespace.refresh_from_db()
    assert (namespace.scheduler_epoch, namespace.claims_paused) == (2, True)
    assert AuditEntry.objects.filter(action="epoch_fence", target=f"fence:{request.pk}").count() == 1


def test_a_fence_job_killed_during_its_self_check_is_finished_without_a_second_bump(celery_workers):
    operator, oncall = make_actor("olivia-operator", "operator"), make_actor("oscar-oncall", "oncall")
    probe = operator.create(node_id="probe").json()["task_id"]  # the oldest task: the self-check's probe
    first = celery_workers.start(**FAST_RESEND_ENV)
    request = fences.fence(
        principal=Principal.objects.get(name=oncall.name), namespace="default", reason="drill"
    )

    with row_locked("SELECT 1 FROM claims_task WHERE task_id = %s FOR UPDATE", [probe]):
        fence_epoch.delay("default", "drill", oncall.name, str(request.pk))
        wait_for_lock_waiters(1)  # the fence was the request's; the self-check's probe waits for the task row
        assert Namespace.objects.get(name="default").scheduler_epoch == 2
        celery_workers.kill(first)

    assert FenceRequest.objects.get().status == "FENCED"
    celery_workers.start(**FAST_RESEND_ENV)
    wait_until_no_backend_holds_an_advisory_lock()
    time.sleep(1.1)
    resend_fences.delay()

    assert wait_for(lambda: FenceRequest.objects.get().finished_at is not None), celery_workers.log()
    done = FenceRequest.objects.get()
    assert (done.status, done.scheduler_epoch, done.runs) == ("CHECKED", 2, 2)
    assert done.self_check == {"ok": True, "detail": "old-epoch commit refused: FENCED (EPOCH)"}
    assert Namespace.objects.get(name="default").scheduler_epoch == 2  # not bumped again
    assert AuditEntry.objects.filter(action="epoch_fence", target=f"fence:{request.pk}").count() == 1
    assert AuditEntry.objects.filter(action="fence_self_check", target=f"fence:{request.pk}").count() == 1


def test_a_rollback_job_killed_inside_its_finishing_transaction_leaves_nothing_half_done(celery_workers):
    operator, oncall = make_actor("olivia-operator", "operator"), make_actor("oscar-oncall", "oncall")
    worker = make_actor("w-moving", "worker")
    operator.post("/namespaces", {"name": "moving", "stage": "V1_ONLY"})
    task_id = operator.create(namespace="moving", node_id="n").json()["task_id"]
    claim = worker.claim(task_id).json()
    key = worker.prepare(claim, "notify", {"x": 1}).json()["effect_id"]
    worker.outcome(claim, key, "UNKNOWN")  # keeps the drain from being clean
    started = oncall.post("/namespaces/moving/rollout/rollback", {"to_stage": "V1_WRITES", "reason": "drill"})
    assert started.status_code == 202, started.content
    oncall.reconcile(
        None, key, "NOT_OCCURRED", reason="checked the target: nothing there"
    )  # now the drain is clean: the next run finishes
    rollback = Rollback.objects.get()
    first = celery_workers.start()

    with row_locked("SELECT 1 FROM rollout_rollback WHERE rollback_id = %s FOR UPDATE", [rollback.pk]):
        advance_rollback.delay(str(rollback.pk))
        wait_for_lock_waiters(1)  # the job holds the namespace row and waits for the rollback's
        # The stage move, the hold's release and DONE are one transaction: nothing of it is visible yet.
        assert stage_of("moving") == "V1_ONLY"
        celery_workers.kill(first)

    ns = Namespace.objects.get(name="moving")
    assert (stage_of(ns.name), ns.pause_hold) == ("V1_ONLY", f"rollback:{rollback.pk}")
    assert Rollback.objects.get().finished_at is None
    celery_workers.start()
    advance_rollback.delay()  # beat's periodic run: every unfinished rollback

    assert wait_for(lambda: Rollback.objects.get().finished_at is not None), celery_workers.log()
    assert Rollback.objects.get().step == "DONE"
    assert list(StageChange.objects.filter(namespace="moving").values_list("to_stage", flat=True)) == [
        "V1_WRITES"
    ]
    ns = Namespace.objects.get(name="moving")
    assert (stage_of(ns.name), ns.claims_paused, ns.pause_hold) == ("V1_WRITES", True, "")


def test_a_delivery_killed_while_the_target_acts_is_sent_again_under_the_same_key(
    operator, effect_target, celery_workers
):
    worker = make_actor("dispatching-worker", "worker")
    task_id = operator.create(node_id="notify").json()["task_id"]
    claim = worker.claim(task_id, ttl=60).json()
    key = worker.prepare(claim, "email", {"to": "ops"}).json()["effect_id"]
    first = celery_workers.start(**FAST_RESEND_ENV)
    effect_target.mode, effect_target.slow_seconds = "slow", 1.5

    worker.dispatch(claim, key, {"to": "ops"}, effect_target.url + "/send")
    assert wait_for(lambda: effect_target.count(key) == 1)  # the target has acted; its reply is not out yet
    celery_workers.kill(first)

    intent = DispatchIntent.objects.get()
    assert (intent.state, Effect.objects.get(pk=key).state) == ("SENDING", "PREPARED")
    effect_target.mode = "ok"
    celery_workers.start(**FAST_RESEND_ENV)
    redeliver_dispatches.delay()  # too early: the dead sender's window has not passed
    time.sleep(1.0)
    assert DispatchIntent.objects.get().state == "SENDING" and effect_target.count(key) == 1
    time.sleep(6.5)  # past DISPATCH_RESEND_AFTER_SECONDS since the dead sender took it
    redeliver_dispatches.delay()
    assert wait_for(lambda: DispatchIntent.objects.get().state == "DELIVERED"), celery_workers.log()

    intent.refresh_from_db()
    assert (intent.outcome, intent.deliveries) == ("COMMITTED", 2)
    assert Effect.objects.get(pk=key).state == "COMMITTED"
    calls = effect_target.calls[key]
    assert len(calls) == 2 and {c["generation"] for c in calls} == {str(claim["claim_generation"])}
    deliver_dispatch.delay(str(intent.pk))  # a late duplicate of the original message: nothing is sent
    time.sleep(1.0)
    assert effect_target.count(key) == 2
