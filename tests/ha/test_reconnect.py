"""Issue 39, 4 — a Celery worker rides through a failover by itself: a job sent before the switch and one sent
during it both run, on the new leader, with no restart of the worker (Celery's Django fixup drops a connection that
failed; the job's own retry covers a run that met the switch). Counted in the database: the jobs' runs
(``claims_jobrun``, appended when a run ends)."""

from __future__ import annotations

import pytest

from claims.tasks import check_serving
from tests.support.processes import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.serial, pytest.mark.timeout(400)]


def _succeeded(cluster) -> int:
    return cluster.sql(
        "select count(*) from claims_jobrun where job = 'claims.check_serving' and outcome = 'SUCCESS'"
    )[0][0]


def test_a_celery_worker_runs_the_jobs_sent_before_and_during_a_failover(cluster, celery_workers):
    cluster.script("sync", "on")
    if not cluster.servers:
        cluster.control_plane(TOKEN_CACHE_SECONDS="0")
    celery_workers.start(DATABASE_URL=cluster.url)
    before = _succeeded(cluster)

    check_serving.delay()
    assert wait_for(lambda: _succeeded(cluster) == before + 1, 60), celery_workers.log()[-3000:]
    cluster.kill_leader()
    check_serving.delay()

    assert wait_for(lambda: _succeeded(cluster) == before + 2, 90), celery_workers.log()[-3000:]
    assert all(proc.poll() is None for proc in celery_workers.procs)  # the same worker, never restarted
