"""Real processes for the tests (a pytest plugin, loaded by tests/conftest.py): Celery worker processes on the
Redis broker against the test database — started, killed with SIGKILL mid-job, started again — and the effect
target the dispatcher delivers to."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import connections

from deploy.topology import AppServer


@pytest.fixture
def effect_target():
    from tests.effect_target import EffectTarget

    target = EffectTarget().start()
    yield target
    target.stop()


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


def process_database_url(alias: str = "default") -> str:
    """A test database as a URL, for the server and worker processes the tests start."""
    db = connections[alias].settings_dict
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def process_databases() -> dict[str, str]:
    """The test databases as the environment of a process the tests start: ours, and the PostgreSQL one beside it
    that stands for a team's legacy database (the ``legacy`` alias) — by name, since in several test processes
    (pytest-xdist) its test name is not ours with ``_legacy`` added."""
    env = {"DATABASE_URL": process_database_url()}
    if "legacy" in connections and connections["legacy"].vendor == "postgresql":
        env["LEGACY_DATABASE_URL"] = process_database_url("legacy")
    return env


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
        from django.conf import settings

        self.env = {
            **os.environ,
            # the suite's own settings: the whole control plane, or the core alone (its database has no rollout tables)
            "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE,
            **process_databases(),
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


@contextmanager
def running_server(**extra_env: str) -> Iterator[str]:
    """``manage.py runserver`` (WSGI, the embedded server) in its own process on the test database, under the
    suite's own settings module; yields its URL once it answers."""
    with server_process(**extra_env) as (url, _):
        yield url


@contextmanager
def server_process(**extra_env: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """``running_server``'s server with its process, for a test that kills it (SIGKILL) mid-request."""
    import httpx
    from django.conf import settings

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE,
        "DEBUG": "false",
        **process_databases(),
        "DATABASE_CONN_MAX_AGE": "60",
        **extra_env,
    }
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            httpx.get(url + "/healthz", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    try:
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)


def restart_postgres() -> None:
    """Restart the Debian cluster (``pg_ctlcluster … restart -m fast``: every session ends) and wait until it
    answers. Needs root; callers skip without it."""
    version = sorted(os.listdir("/etc/postgresql"))[0]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart", "-m", "fast"],
        check=True,
        capture_output=True,
    )
    for _ in range(60):
        if subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432"]).returncode == 0:
            return
        time.sleep(0.5)
    raise AssertionError("PostgreSQL did not come back")


def can_restart_postgres() -> bool:
    return os.path.isdir("/etc/postgresql") and os.geteuid() == 0


def server_env(**env: str) -> dict[str, str]:
    """The environment of a production server on the test database: the production profile of the suite's own
    (the whole control plane, or the core alone), pooled connections, no rate limit unless ``env`` sets one."""
    from django.conf import settings

    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": {"controlplane.settings.test_core": "controlplane.settings.core"}.get(
            settings.SETTINGS_MODULE, "controlplane.settings"
        ),
        "DATABASE_URL": process_database_url(),
        "DATABASE_POOL": "true",
        "API_RATE_LIMIT": "",
        **env,
    }


@pytest.fixture
def app_servers(tmp_path) -> Iterator[Callable[..., AppServer]]:
    """Start production servers (deploy/topology.py) on the test database for a test (``app_servers(**env)``);
    all are stopped at its end."""
    started: list[AppServer] = []

    def start(**env: str) -> AppServer:
        server = AppServer(tmp_path, server_env(**env)).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
