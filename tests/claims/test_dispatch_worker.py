"""The deliver_dispatch job through a real Celery worker process on a real Redis broker (the eager path is
covered in test_dispatch.py). Needs PostgreSQL (the worker is another process) and CELERY_BROKER_URL=redis://…"""

from __future__ import annotations

import pytest
from django.conf import settings

from claims.models import DispatchIntent, Effect
from claims.tasks import deliver_dispatch
from tests.support.actors import make_actor
from tests.support.processes import wait_for


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_delivers_the_intent_once_even_when_the_job_is_sent_twice(
    operator, effect_target, celery_workers, celery_worker_process
):
    assert settings.DISPATCH_ALLOWED_HOSTS
    worker = make_actor("dispatching-worker", "worker")
    task_id = operator.create(node_id="notify").json()["task_id"]
    claim = worker.claim(task_id, ttl=60).json()
    key = worker.prepare(claim, "email", {"to": "ops"}).json()["effect_id"]

    recorded = worker.dispatch(claim, key, {"to": "ops"}, effect_target.url + "/send")  # enqueued on commit
    deliver_dispatch.delay(recorded.json()["dispatch_id"])  # a duplicate job: must not send again

    delivered = wait_for(lambda: Effect.objects.get(pk=key).state == "COMMITTED")
    wait_for(lambda: False, seconds=1.0)  # give the duplicate its chance to misbehave
    assert delivered, celery_workers.log()
    assert effect_target.count(key) == 1 and effect_target.count() == 1
    intent = DispatchIntent.objects.get()
    assert (intent.state, intent.outcome, intent.deliveries) == ("DELIVERED", "COMMITTED", 1)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_records_a_lost_reply_as_unknown(operator, effect_target, celery_worker_process):
    worker = make_actor("dispatching-worker", "worker")
    task_id = operator.create(node_id="notify").json()["task_id"]
    claim = worker.claim(task_id, ttl=60).json()
    key = worker.prepare(claim, "email", {"to": "ops"}).json()["effect_id"]
    effect_target.mode = "drop_reply"

    worker.dispatch(claim, key, {"to": "ops"}, effect_target.url + "/send")

    assert wait_for(lambda: Effect.objects.get(pk=key).state == "UNKNOWN")
    assert effect_target.count(key) == 1
