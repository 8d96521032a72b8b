"""Named actors and the controllable clock.

``worker_a``, ``worker_b`` … are workers with their own tokens and API clients; ``operator`` and ``oncall``
likewise. Each actor offers the contract's calls, returning the HTTP response, so a test reads like the
contract: ``worker_a.claim(task)``, ``worker_b.commit(task, claim, result)``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections, transaction
from rest_framework.test import APIClient

from claims import clock, interleave
from claims.digest import digest
from claims.models import Namespace
from claims.services import token_issue


def pytest_collection_modifyitems(config, items):
    from django.conf import settings

    if settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL over several connections (set DATABASE_URL)")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _no_stray_sessions_at_teardown(django_db_setup, django_db_blocker):
    """Live-server and worker threads can leave a PostgreSQL session behind; end them before the test database
    is dropped, so teardown never fails with "being accessed by other users"."""
    yield
    with django_db_blocker.unblock():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )


@pytest.fixture(autouse=True)
def _reset_clock_and_hooks() -> Iterator[None]:
    clock.reset()
    interleave.clear()
    yield
    clock.reset()
    interleave.clear()


class Clock:
    """The controllable clock: moves the database clock's reading forward, no sleeping."""

    def travel(self, seconds: float) -> None:
        clock.travel(seconds)

    def now(self):
        return clock.now()


@pytest.fixture
def db_clock() -> Clock:
    return Clock()


@dataclass
class Actor:
    name: str
    role: str
    token: str
    client: APIClient

    def post(self, path: str, body: Any = None):
        return self.client.post(f"/api/v1{path}", body if body is not None else {}, format="json")

    def get(self, path: str, **params):
        return self.client.get(f"/api/v1{path}", params)

    # --- the contract's calls, with defaults a well-behaved worker would send ---
    def create(self, node_id: str = "node", input: Any = None, **fields):
        return self.post(
            "/tasks", {"node_id": node_id, "input": input if input is not None else {"n": 1}, **fields}
        )

    def claim(self, task_id: str, *, epoch: int = 1, ttl: int = 30, **fields):
        body = {"owner_id": self.name, "scheduler_epoch": epoch, "ttl_seconds": ttl, **fields}
        return self.post(f"/tasks/{task_id}/claim", body)

    def claim_next(self, *, epoch: int = 1, ttl: int = 30, **fields):
        return self.post(
            "/claims", {"owner_id": self.name, "scheduler_epoch": epoch, "ttl_seconds": ttl, **fields}
        )

    def renew(self, claim: dict, *, extend: int = 30, **override):
        body = {
            "attempt_id": claim["attempt_id"],
            "claim_generation": claim["claim_generation"],
            "owner_id": self.name,
            "scheduler_epoch": claim["scheduler_epoch"],
            "cancel_generation": claim["cancel_generation"],
            "extend_seconds": extend,
            **override,
        }
        return self.post(f"/tasks/{claim['task_id']}/renew", body)

    def release(self, claim: dict, **override):
        body = {
            "attempt_id": claim["attempt_id"],
            "claim_generation": claim["claim_generation"],
            "owner_id": self.name,
            "scheduler_epoch": claim["scheduler_epoch"],
            **override,
        }
        return self.post(f"/tasks/{claim['task_id']}/release", body)

    def stage(self, claim: dict, result: Any, **override):
        body = {
            "attempt_id": claim["attempt_id"],
            "claim_generation": claim["claim_generation"],
            "result": result,
            "result_digest": digest(result),
            **override,
        }
        return self.post(f"/tasks/{claim['task_id']}/results", body)

    def commit(self, claim: dict, result: Any, **override):
        body = {
            "attempt_id": claim["attempt_id"],
            "scheduler_epoch": claim["scheduler_epoch"],
            "claim_generation": claim["claim_generation"],
            "observed_cancel_generation": claim["cancel_generation"],
            "input_digest": claim["input_digest"],
            "result_digest": digest(result),
            **override,
        }
        return self.post(f"/tasks/{claim['task_id']}/commit", body)

    def prepare(self, claim: dict, slot: str, payload: Any, **override):
        body = {
            "task_id": claim["task_id"],
            "effect_slot": slot,
            "payload_digest": digest(payload),
            "attempt_id": claim["attempt_id"],
            "claim_generation": claim["claim_generation"],
            "scheduler_epoch": claim["scheduler_epoch"],
            "owner_id": self.name,
            **override,
        }
        return self.post("/effects/prepare", body)

    def _attempt(self, claim: dict) -> dict:
        return {
            "attempt_id": claim["attempt_id"],
            "claim_generation": claim["claim_generation"],
            "scheduler_epoch": claim["scheduler_epoch"],
            "owner_id": self.name,
        }

    def outcome(self, claim: dict, effect_id: str, state: str, **override):
        return self.post(
            f"/effects/{effect_id}/outcome", {"state": state, **self._attempt(claim), **override}
        )

    def reconcile(self, claim: dict | None, effect_id: str, observed: str, **override):
        body = {"observed": observed, **(self._attempt(claim) if claim else {}), **override}
        return self.post(f"/effects/{effect_id}/reconcile", body)

    def dispatch(self, claim: dict, effect_id: str, payload: Any, target: str, **override):
        body = {"payload": payload, "target": target, **self._attempt(claim), **override}
        return self.post(f"/effects/{effect_id}/dispatch", body)

    def finish(self, claim: dict, result: Any):
        """Stage then commit: the healthy path."""
        staged = self.stage(claim, result)
        assert staged.status_code == 201, staged.content
        return self.commit(claim, result)


def ensure_default_namespace() -> None:
    """Transactional tests flush every table afterwards, the migration's `default` namespace included; put it
    back as the migration made it."""
    from django.utils import timezone

    now = timezone.now()
    Namespace.objects.get_or_create(name="default", defaults={"created_at": now, "updated_at": now})


def make_actor(name: str, role: str, pool: str = "") -> Actor:
    ensure_default_namespace()
    issued = token_issue(name=name, role=role, pool=pool)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.token}")
    return Actor(name=name, role=role, token=issued.token, client=client)


@pytest.fixture
def worker_a(db) -> Actor:
    return make_actor("worker-a", "worker", "v1")


@pytest.fixture
def worker_b(db) -> Actor:
    return make_actor("worker-b", "worker", "v1")


@pytest.fixture
def worker_c(db) -> Actor:
    return make_actor("worker-c", "worker", "v1")


@pytest.fixture
def operator(db) -> Actor:
    return make_actor("olivia-operator", "operator")


@pytest.fixture
def oncall(db) -> Actor:
    return make_actor("oscar-oncall", "oncall")


@pytest.fixture
def effect_target():
    from tests.effect_target import EffectTarget

    target = EffectTarget().start()
    yield target
    target.stop()


@pytest.fixture
def anonymous() -> APIClient:
    return APIClient()


@pytest.fixture
def default_namespace(db) -> Namespace:
    ensure_default_namespace()
    return Namespace.objects.get(name="default")


@pytest.fixture
def ready_task(operator) -> str:
    response = operator.create(node_id="build-parser", input={"source": "grammar.y"})
    assert response.status_code == 201, response.content
    return response.json()["task_id"]


# --- several connections ---------------------------------------------------------------------------


def run_in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` in a thread with its own database connection; the outcome lands in the returned dict."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


@contextmanager
def row_locked(sql: str, params: list):
    """Hold ``sql``'s row lock (… FOR UPDATE) on another connection until the block ends."""
    locked, release = threading.Event(), threading.Event()

    def hold():
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, params)
            locked.set()
            release.wait(60)

    thread, box = run_in_thread(hold)
    assert locked.wait(10), box
    try:
        yield
    finally:
        release.set()
        thread.join(10)


class Pause:
    """Blocks the thread that reaches ``point`` until the test calls ``resume()``."""

    def __init__(self, point: str, *, times: int = 1):
        self.point = point
        self.reached = threading.Event()
        self._resume = threading.Event()
        self._lock = threading.Lock()
        self._left = times
        interleave.install(point, self._hook)

    def _hook(self) -> None:
        with self._lock:
            if self._left <= 0:
                return
            self._left -= 1
        self.reached.set()
        assert self._resume.wait(30), f"nobody resumed {self.point}"

    def wait_reached(self) -> None:
        assert self.reached.wait(30), f"no thread reached {self.point}"

    def resume(self) -> None:
        self._resume.set()


def _lock_waiters(cursor) -> int:
    cursor.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    return cursor.fetchone()[0]


def wait_for_lock_waiters(count: int, timeout: float = 20.0) -> None:
    """Poll pg_stat_activity until ``count`` backends wait on a row lock (the competing transaction has
    really queued behind the paused one). Polling a condition, not sleeping to make a race."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            if _lock_waiters(cursor) >= count:
                return
            time.sleep(0.01)
    raise AssertionError(f"fewer than {count} transactions waited on a lock within {timeout}s")


def wait_done_or_waiting(box: dict, waiters: int, timeout: float = 20.0) -> None:
    """Poll until the competitor started with ``run_in_thread`` has either finished (its box is filled) or queued
    behind a lock (``waiters`` backends wait): each is a valid order to resume the paused party from."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            if box or _lock_waiters(cursor) >= waiters:
                return
            time.sleep(0.01)
    raise AssertionError(f"the competitor neither finished nor waited on a lock within {timeout}s")


def pg_deadlocks() -> int:
    """PostgreSQL's own count of the deadlocks it detected in the test database (pg_stat_database)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


# --- a real Celery worker process ---------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


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


def process_database_url() -> str:
    """The test database as a DATABASE_URL, for the server and worker processes the tests start."""
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


# Job workers that give up on a dead sender's delivery or fence quickly enough for a test (the dispatch window must
# stay above three timeouts, settings/base.py).
FAST_RESEND_ENV = {
    "DISPATCH_TIMEOUT_SECONDS": "2",
    "DISPATCH_RESEND_AFTER_SECONDS": "7",
    "FENCE_RESEND_AFTER_SECONDS": "1",
}


class CeleryWorkers:
    """Real ``celery worker`` processes on the Redis broker, against the test database: start several, kill one
    with SIGKILL mid-job, start another. Each writes its output to a file (``log()``), never to a pipe that could
    fill and stall it."""

    def __init__(self, broker: str, log_dir: Path):
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "controlplane.settings.test",
            "DATABASE_URL": process_database_url(),
            "CELERY_BROKER_URL": broker,
            "CELERY_TASK_ALWAYS_EAGER": "false",
        }
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []

    def start(self, **env: str) -> subprocess.Popen:
        log = open(self.log_dir / f"celery-{len(self.procs)}.log", "w")  # noqa: SIM115 - closed by the process
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool", "solo"]
            + ["--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=ROOT,
            env={**self.env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def log(self) -> str:
        return "\n".join(path.read_text() for path in sorted(self.log_dir.glob("celery-*.log")))

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
def celery_workers(tmp_path) -> Iterator[CeleryWorkers]:
    broker = _redis_broker()
    if broker is None:
        pytest.skip("needs a reachable Redis in CELERY_BROKER_URL (redis://…); .ci/run sets one")
    _celery_app().connection_for_write().default_channel.client.flushdb()  # no jobs left from earlier runs
    workers = CeleryWorkers(broker, tmp_path)
    previous = _celery_app().conf.task_always_eager
    _celery_app().conf.task_always_eager = False
    yield workers
    _celery_app().conf.task_always_eager = previous
    workers.stop_all()


@pytest.fixture
def celery_worker_process(celery_workers) -> subprocess.Popen:
    return celery_workers.start()


def wait_for(predicate, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def _celery_app():
    from controlplane.celery import app

    return app
