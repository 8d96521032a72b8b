"""The deliver_dispatch job through a real Celery worker process on a real Redis broker (the eager path is
covered in test_dispatch.py). Needs PostgreSQL (the worker is another process) and CELERY_BROKER_URL=redis://…"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from claims.models import DispatchIntent, Effect
from claims.tasks import deliver_dispatch
from controlplane.celery import app as celery_app
from tests.conftest import make_actor

ROOT = Path(__file__).resolve().parents[2]


def _redis_broker() -> str | None:
    url = os.environ.get("CELERY_BROKER_URL", "")
    if not url.startswith("redis://"):
        return None
    try:
        import redis

        redis.Redis.from_url(url).ping()
    except Exception:
        return None
    return url


@pytest.fixture
def celery_worker_process():
    broker = _redis_broker()
    if broker is None:
        pytest.skip("needs a reachable Redis in CELERY_BROKER_URL (redis://…); .ci/run sets one")
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings.test",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "CELERY_BROKER_URL": broker,
        "CELERY_TASK_ALWAYS_EAGER": "false",
    }
    celery_app.connection_for_write().default_channel.client.flushdb()  # no jobs left from earlier runs
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "controlplane",
            "worker",
            "--pool",
            "solo",
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = False
    yield worker
    celery_app.conf.task_always_eager = previous
    worker.terminate()
    try:
        worker.wait(10)
    except subprocess.TimeoutExpired:
        worker.kill()


def _wait_for(predicate, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_delivers_the_intent_once_even_when_the_job_is_sent_twice(
    operator, effect_target, celery_worker_process
):
    assert settings.DISPATCH_ALLOWED_HOSTS
    worker = make_actor("dispatching-worker", "worker")
    task_id = operator.create(node_id="notify").json()["task_id"]
    claim = worker.claim(task_id, ttl=60).json()
    key = worker.prepare(claim, "email", {"to": "ops"}).json()["effect_id"]

    recorded = worker.dispatch(claim, key, {"to": "ops"}, effect_target.url + "/send")  # enqueued on commit
    deliver_dispatch.delay(recorded.json()["dispatch_id"])  # a duplicate job: must not send again

    delivered = _wait_for(lambda: Effect.objects.get(pk=key).state == "COMMITTED")
    _wait_for(lambda: False, seconds=1.0)  # give the duplicate its chance to misbehave
    assert delivered, celery_worker_process.stdout.read() if celery_worker_process.poll() is not None else ""
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

    assert _wait_for(lambda: Effect.objects.get(pk=key).state == "UNKNOWN")
    assert effect_target.count(key) == 1
