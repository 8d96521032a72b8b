"""``/healthz`` and ``/readyz`` (controlplane/health.py): what a load balancer asks each app server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client

import controlplane

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db
def test_healthz_answers_without_touching_the_database(django_assert_num_queries):
    with django_assert_num_queries(0):
        answer = Client().get("/healthz")

    assert answer.status_code == 200 and answer.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_is_ready_when_the_database_is_migrated_and_jobs_run_inline():
    answer = Client().get("/readyz")

    assert answer.status_code == 200, answer.json()
    assert answer.json() == {
        "status": "ready",
        "version": controlplane.__version__,  # the one number: the distribution's, `claimctl --version`'s
        "checks": {"database": "ok", "migrations": "ok", "broker": "eager"},
    }


@pytest.mark.django_db
def test_readyz_reaches_the_real_broker_and_says_when_it_cannot(settings):
    broker = os.environ.get("CELERY_BROKER_URL", "")
    if not broker.startswith(("redis://", "amqp://")):
        pytest.skip("needs a real broker in CELERY_BROKER_URL; .ci/run sets one")
    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.CELERY_BROKER_URL = broker
    reachable = Client().get("/readyz")
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    unreachable = Client().get("/readyz")

    assert reachable.status_code == 200 and reachable.json()["checks"]["broker"] == "ok"
    assert unreachable.status_code == 503
    assert unreachable.json()["status"] == "not ready"
    assert unreachable.json()["checks"] == {"database": "ok", "migrations": "ok", "broker": "unreachable"}


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
@pytest.mark.django_db
def test_the_probes_answer_only_reads(path):
    assert Client().post(path).status_code == 405


def test_readyz_is_not_ready_while_migrations_are_pending(tmp_path):
    """A fresh SQLite database nobody migrated: the database answers, the migrations do not hold."""
    script = (
        "import django, json; django.setup(); from django.test import Client; "
        "r = Client().get('/readyz'); print(r.status_code, json.dumps(r.json()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "DATABASE_URL": f"sqlite:///{tmp_path / 'fresh.sqlite3'}",
            "CONTROLPLANE_VAR_DIR": str(tmp_path),
            "CELERY_TASK_ALWAYS_EAGER": "true",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )

    status, _, body = done.stdout.strip().partition(" ")
    assert status == "503", done.stdout + done.stderr
    assert "pending" in body and '"database": "ok"' in body
