"""Rollout's and the core's periodic jobs, eagerly and through a real Celery worker process on Redis."""

from __future__ import annotations

import pytest

from claims.errors import Forbidden, NotFound
from claims.models import AuditEntry, Namespace, Principal, TaskEvent
from claims.tasks import reap_expired_leases
from oncall import services as fences
from oncall import tasks as oncall_jobs
from oncall.models import FenceRequest
from rollout import tasks as jobs
from rollout.models import DrainSnapshot, LegacyClaim, Mismatch
from tests.support.actors import make_actor
from tests.support.processes import wait_for


def test_fence_epoch_fences_and_proves_an_old_epoch_commit_is_refused(operator, oncall, ready_task):
    result = oncall_jobs.fence_epoch.delay("default", "drill", oncall.name).get()

    assert result["scheduler_epoch"] == 2
    assert result["self_check"] == {"ok": True, "detail": "old-epoch commit refused: FENCED (EPOCH)"}
    namespace = Namespace.objects.get(name="default")
    assert (namespace.scheduler_epoch, namespace.claims_paused) == (2, True)
    check = AuditEntry.objects.get(action="fence_self_check")
    assert check.detail["ok"] is True and check.principal == "oscar-oncall"


def test_a_fence_self_check_left_unfinished_is_sent_again_and_recorded_once(oncall, ready_task, db_clock):
    request = fences.fence(principal=Principal.objects.get(name=oncall.name), namespace="default", reason="x")
    # Its job never ran (a lost message, a dead worker): nothing happens before the resend window.
    assert oncall_jobs.resend_fences.delay().get() == {"resent": 0}
    db_clock.travel(31)

    assert oncall_jobs.resend_fences.delay().get() == {"resent": 1}
    assert oncall_jobs.resend_fences.delay().get() == {"resent": 0}
    oncall_jobs.fence_epoch.delay("default", "x", oncall.name, str(request.pk)).get()  # a duplicate message

    done = FenceRequest.objects.get()
    assert (done.status, done.scheduler_epoch, done.runs) == ("CHECKED", 2, 1)
    assert Namespace.objects.get(name="default").scheduler_epoch == 2


def test_a_fence_request_is_oncalls_and_names_a_namespace(operator, oncall):
    with pytest.raises(Forbidden):
        fences.fence(principal=Principal.objects.get(name=operator.name), namespace="default", reason="x")
    with pytest.raises(NotFound):
        fences.fence(principal=Principal.objects.get(name=oncall.name), namespace="nope", reason="x")
    assert not FenceRequest.objects.exists()


def test_reap_records_lease_expiry_once(worker_a, ready_task, db_clock):
    worker_a.claim(ready_task, ttl=5)
    db_clock.travel(6)

    first = reap_expired_leases.delay().get()
    second = reap_expired_leases.delay().get()

    assert (first, second) == ({"reaped": 1}, {"reaped": 0})
    assert TaskEvent.objects.filter(task_id=ready_task, kind="lease_expired").count() == 1


def test_drain_check_snapshots_migrating_namespaces(operator):
    operator.post("/namespaces", {"name": "moving", "stage": "V1_WRITES"})

    result = jobs.drain_check.delay().get()

    assert result == [{"namespace": "moving", "clean": True, "clean_streak": 1}]
    assert DrainSnapshot.objects.filter(namespace="moving").count() == 1


def test_compare_shadow_settles_a_winner_that_differs_after_the_fact(operator, worker_a):
    operator.post("/namespaces", {"name": "late", "stage": "V1_WRITES"})
    task_id = operator.create(namespace="late").json()["task_id"]
    claim = worker_a.claim(task_id).json()
    worker_a.stage(claim, {"v": 1})
    worker_a.commit(claim, {"v": 1})
    # Someone writes the legacy table behind the control plane's back.
    LegacyClaim.objects.filter(pk=task_id).update(result={"v": 2}, result_digest="sha256:" + "2" * 64)

    first = jobs.compare_shadow.delay().get()
    again = jobs.compare_shadow.delay().get()

    assert (first, again) == ({"recorded": 1}, {"recorded": 0})
    assert Mismatch.objects.get().reason == "WINNER_DIFFERS"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_jobs_run_in_a_real_worker_process(celery_worker_process, db_clock):
    operator = make_actor("olivia-operator", "operator")
    oncall = make_actor("oscar-oncall", "oncall")
    task_id = operator.create(node_id="n").json()["task_id"]

    oncall_jobs.fence_epoch.delay("default", "from a worker", oncall.name)

    assert wait_for(lambda: AuditEntry.objects.filter(action="fence_self_check").exists())
    assert AuditEntry.objects.get(action="fence_self_check").detail["ok"] is True
    assert Namespace.objects.get(name="default").scheduler_epoch == 2
    # The self-check's refused probe commit is synthetic: not traffic on the task's timeline, not counted.
    assert not TaskEvent.objects.filter(task_id=task_id, kind="fenced").exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_singleton_job_does_nothing_while_another_run_holds_its_lock():
    import threading

    from claims.locks import singleton
    from tests.support.races import run_in_thread

    holding, release = threading.Event(), threading.Event()

    def hold():
        with singleton("compare_shadow") as got:
            holding.set()
            release.wait(10)
            return got

    thread, box = run_in_thread(hold)
    holding.wait(10)
    second = jobs.compare_shadow.delay().get()
    release.set()
    thread.join(10)

    assert box["value"] is True and second == {"skipped": "another run holds the lock"}
