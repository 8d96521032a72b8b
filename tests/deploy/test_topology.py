"""The production topology under faults (deploy/topology.py, Debian's haproxy and pgbouncer): two app servers
behind haproxy, PgBouncer in transaction mode in front of PostgreSQL, two Celery workers and one beat on Redis. A
fleet of chaos workers (tests/chaos/worker.py) claims, dispatches through the gateway and commits through the load
balancer while, each round:

- one app server is SIGKILLed (master and workers) and started again on its port;
- PgBouncer is restarted (every server connection of every process dies with it);
- an on-call fence's self-check runs as the fence_epoch job and the Celery worker running it is SIGKILLed
  inside the check's transaction; the beat's resend_fences finishes it on the other worker, once;
- a Celery worker is SIGKILLed while it delivers a dispatch, and started again.

Then the history checker of tests/chaos holds over the whole run: one canonical commit per task, generations
increasing, no older authority accepted after a newer one, every acknowledged commit kept in the rows, at most one
COMMITTED per effect. TOPOLOGY_SECONDS (default 14: one round of every fault) sets the run's length; docs/deployment.md has a longer run.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest

from claims.models import AuditEntry, DispatchIntent, Namespace, Principal
from claims.tasks import redeliver_dispatches
from deploy.topology import AppServer, HAProxy, PgBouncer, Process, celery
from oncall import services as fences
from oncall.models import FenceRequest
from oncall.tasks import fence_epoch
from tests.chaos.test_history import check_effects, check_invariants, create_tasks, spawn_workers
from tests.support.actors import ensure_default_namespace, make_actor
from tests.support.processes import (
    FAST_RESEND_ENV,
    _celery_app,
    _redis_broker,
    process_database_url,
    server_env,
    wait_for,
)
from tests.support.races import row_locked

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
SECONDS = float(os.environ.get("TOPOLOGY_SECONDS", "14"))
TASKS = int(600 * max(1.0, SECONDS / 20))  # more than the fleet can do in the run: work throughout


class Topology:
    """The processes of one topology on the test database, each logging to a file in ``run_dir``."""

    def __init__(self, run_dir: Path, broker: str):
        self.run_dir = run_dir
        direct = process_database_url()
        self.bouncer = PgBouncer(run_dir, direct, pool_size=10).start()
        self.env = server_env(
            DATABASE_URL=self.bouncer.url_for(direct),
            DATABASE_PGBOUNCER="true",
            DATABASE_LISTEN_URL=direct,
            CELERY_BROKER_URL=broker,
            CELERY_TASK_ALWAYS_EAGER="false",
            DISPATCH_ALLOWED_HOSTS="127.0.0.1",
            **FAST_RESEND_ENV,
        )
        self.servers = [AppServer(run_dir, self.env).start() for _ in range(2)]
        self.balancer = HAProxy(run_dir, self.servers).start()
        self.jobs = [celery(run_dir, self.env, f"worker{i}").start() for i in range(2)]
        self.beat = celery(run_dir, self.env, "beat", beat=True).start()
        self.generation = 0

    @property
    def url(self) -> str:
        return self.balancer.url

    def kill_server(self, index: int) -> None:
        """SIGKILL an app server (the gunicorn master and its workers) and start it again on the same port."""
        server = self.servers[index]
        server.kill()
        time.sleep(1.0)  # haproxy's checks see it down; requests to it are answered 502 meanwhile
        self.servers[index] = AppServer(self.run_dir, self.env, port=server.port).start()

    def restart_job_worker(self, index: int) -> None:
        self.jobs[index].kill()
        self.generation += 1
        self.jobs[index] = celery(self.run_dir, self.env, f"worker{index}-{self.generation}").start()

    def job_worker_running(self, task_id: str) -> int | None:
        """Which Celery worker received the job ``task_id`` (its log says so), if any."""
        for index, worker in enumerate(self.jobs):
            if re.search(rf"Task [\w.]+\[{task_id}\] received", worker.log()):
                return index
        return None

    def job_worker_busy_with(self, name: str) -> int | None:
        """A Celery worker in the middle of a ``name`` job: received, not yet finished (``--pool solo`` runs one job
        at a time)."""
        for index, worker in enumerate(self.jobs):
            log = worker.log()
            received = re.findall(rf"Task {re.escape(name)}\[([\w-]+)\] received", log)
            if received and not re.search(
                rf"Task {re.escape(name)}\[{received[-1]}\] (succeeded|raised|retry)", log
            ):
                return index
        return None

    def wait_busy_with(self, name: str, seconds: float) -> int | None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if (index := self.job_worker_busy_with(name)) is not None:
                return index
            time.sleep(0.02)
        return None

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.log()[-3000:]}"
            for p in [self.balancer, *self.servers, *self.jobs, self.beat, self.bouncer]
        )

    def stop(self) -> None:
        processes: list[Process] = [self.balancer, *self.servers, *self.jobs, self.beat, self.bouncer]
        for process in processes:
            process.stop(10)


@pytest.fixture
def topology(tmp_path):
    missing = [
        b for b in ("pgbouncer", "haproxy") if not (shutil.which(b) or Path(f"/usr/sbin/{b}").exists())
    ]
    if missing:
        pytest.skip(f"needs Debian's {' and '.join(missing)}: scripts/install-topology.sh (.ci/run runs it)")
    broker = _redis_broker()
    if broker is None:
        pytest.skip("needs a reachable Redis in CELERY_BROKER_URL (redis://…); .ci/run sets one")
    app = _celery_app()
    app.connection_for_write().default_channel.client.flushdb()
    previous, app.conf.task_always_eager = app.conf.task_always_eager, False
    running = Topology(tmp_path, broker)
    yield running
    running.stop()
    app.conf.task_always_eager = previous


def fence_killing_its_job_worker(topology: Topology, oncall, n: int) -> str:
    """An on-call fence as the console makes it (at once), its self-check run as the fence_epoch job; the Celery
    worker that received the job is SIGKILLed while the check's probe waits on the namespace row this test holds.
    Returns the request's id: the beat's resend_fences must finish it."""
    request = fences.fence(
        principal=Principal.objects.get(name=oncall.name), namespace="chaos", reason=f"topology round {n}"
    )
    with row_locked("SELECT 1 FROM claims_namespace WHERE name = %s FOR UPDATE", ["chaos"]):
        job = fence_epoch.delay("chaos", request.reason, oncall.name, str(request.pk))
        assert wait_for(lambda: FenceRequest.objects.get(pk=request.pk).runs >= 1, seconds=20), (
            topology.logs()
        )
        index = topology.job_worker_running(job.id)
        assert index is not None, topology.logs()
        time.sleep(0.2)
        topology.restart_job_worker(index)
    return str(request.pk)


@pytest.mark.timeout(240 + SECONDS * 4)
def test_a_worker_fleet_through_the_load_balancer_survives_killed_servers_pgbouncer_and_job_workers(
    topology, effect_target
):
    ensure_default_namespace()
    operator, oncall = make_actor("chaos-op", "operator"), make_actor("chaos-oncall", "oncall")
    operator.post("/namespaces", {"name": "chaos"})
    create_tasks(operator, TASKS, kinds=("plain", "dispatch", "plain"))
    workers = [make_actor(f"chaos-w{i}", "worker") for i in range(4)]
    logs = [topology.run_dir / f"{w.name}.jsonl" for w in workers]
    faults: dict[str, int] = defaultdict(int)
    fence_ids: list[str] = []
    lb = httpx.Client(base_url=topology.url, headers={"Authorization": f"Bearer {oncall.token}"}, timeout=30)

    end = time.monotonic() + SECONDS
    procs = spawn_workers(topology.url, workers, logs, effect_target.url, seconds=SECONDS)
    rounds = 0
    while rounds == 0 or time.monotonic() + 15 < end:
        rounds += 1
        time.sleep(2.0)
        topology.kill_server(rounds % 2)
        faults["SIGKILL an app server, started again"] += 1
        time.sleep(2.0)
        topology.bouncer.restart()
        faults["PgBouncer restarted"] += 1
        time.sleep(2.0)
        fence_ids.append(fence_killing_its_job_worker(topology, oncall, rounds))
        faults["SIGKILL the Celery worker inside fence_epoch"] += 1
        assert wait_for(  # the beat (one process) resends it; the other worker runs it
            lambda: FenceRequest.objects.get(pk=fence_ids[-1]).finished_at is not None, seconds=40
        ), topology.logs()
        resumed = lb.post("/api/v1/namespaces/chaos/resume", json={"reason": f"round {rounds} over"})
        assert resumed.status_code == 200, resumed.text
        delivering = topology.wait_busy_with("claims.deliver_dispatch", seconds=5)
        if delivering is not None:
            topology.restart_job_worker(delivering)
            faults["SIGKILL a Celery worker delivering a dispatch, started again"] += 1
    for proc in procs:
        proc.wait(max(0, end - time.monotonic()) + 60)
    # Every dispatch ends delivered or skipped: a dead worker's deliveries are sent again under their key.
    assert wait_for(lambda: redeliver_dispatches.delay() and _deliveries_done(), seconds=60), topology.logs()

    history = check_invariants(logs, min_commits=20)
    effects = check_effects(effect_target)
    assert not [e for e in history if e["outcome"] == "INVALID"]
    assert effects["target_calls"] >= 5, effects  # the Celery workers delivered dispatches
    server_errors = {e["status"] for e in history if e["status"] >= 500}
    assert server_errors <= {502, 503}, (
        server_errors
    )  # the balancer's 502 for a dying server, 503 unavailable; no 500
    for fence_id in fence_ids:  # applied once, whatever its job's death
        request = FenceRequest.objects.get(pk=fence_id)
        assert request.status == "CHECKED" and request.self_check["ok"], request.summary()
        assert AuditEntry.objects.filter(action="epoch_fence", target=f"fence:{fence_id}").count() == 1
    assert Namespace.objects.get(name="chaos").scheduler_epoch == 1 + len(fence_ids)
    assert topology.beat.alive() and all(server.alive() for server in topology.servers)
    errors = sum(e["outcome"] in ("ERROR", "UNAVAILABLE") or e["status"] >= 500 for e in history)
    outcomes: dict[str, int] = defaultdict(int)
    for e in history:
        outcomes[f"{e['op']}:{e['outcome']}:{e['status']}"] += 1
    print(
        f"\nTOPOLOGY {len(history)} operations in {SECONDS:.0f} s, {rounds} rounds, faults: {dict(faults)}\n"
        f"{errors} requests failed (no answer, 502 or 503) and were asked again\n"
        f"outcomes: {dict(sorted(outcomes.items()))}\neffects: {effects}"
    )


def _deliveries_done() -> bool:
    time.sleep(1.0)
    return not DispatchIntent.objects.filter(state__in=["PENDING", "SENDING"]).exists()
