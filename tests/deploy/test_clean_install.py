"""``pip install .`` alone, into a clean venv with no extras, runs the whole production profile on PostgreSQL:
migrations, the production server (gunicorn + uvicorn workers, ready on /readyz) and a Celery worker that runs a job
on Redis and on RabbitMQ — on each Python the project allows that this machine has (3.11, and pyenv's 3.12 and 3.13 when
present). Before ``celery[redis]``/``kombu[redis]`` the Redis worker died here: ``No module named 'packaging'``.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from deploy.topology import AppServer, celery
from tests.support.processes import _redis_broker, wait_for

ROOT = Path(__file__).resolve().parents[2]
RABBITMQ_URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")


def _pythons() -> list[str]:
    found = {f"{sys.version_info.major}.{sys.version_info.minor}": sys.executable}
    for minor in ("3.12", "3.13"):
        for candidate in sorted(Path("/root/.pyenv/versions").glob(f"{minor}.*"), reverse=True):
            if (candidate / "bin/python3").exists():
                found.setdefault(minor, str(candidate / "bin/python3"))
                break
    return [found[v] for v in sorted(found)]


def _listening(url: str) -> bool:
    parts = urlsplit(url)
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((parts.hostname or "127.0.0.1", parts.port or 5672)) == 0


@pytest.fixture(scope="module", params=_pythons(), ids=lambda p: Path(p).parent.parent.name)
def clean_venv(request, tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([request.param, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    done = subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "install", "--quiet", str(ROOT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return venv


@pytest.fixture
def postgres_database() -> Iterator[str]:
    """A PostgreSQL database of its own on the server DATABASE_URL names (CI's), dropped afterwards; the production
    profile runs on PostgreSQL."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        pytest.skip("needs DATABASE_URL=postgres://… (.ci/run sets one)")
    import psycopg

    parts = urlsplit(url)
    name = f"clean_install_{uuid.uuid4().hex[:8]}"
    admin = parts._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield parts._replace(path=f"/{name}").geturl()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _env(venv: Path, database: str, broker: str) -> dict[str, str]:
    """Only the clean venv on PATH, the production settings, a database of its own."""
    return {
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "DATABASE_URL": database,
        "CELERY_BROKER_URL": broker,
        "SECRET_KEY": "clean-install-" + "k" * 40 + "abcdefgh",
    }


@pytest.mark.timeout(900)
def test_a_clean_install_without_extras_migrates_serves_and_runs_jobs_on_redis_and_rabbitmq(
    clean_venv, postgres_database, tmp_path
):
    redis_url = _redis_broker()
    if redis_url is None:
        pytest.skip("needs a reachable Redis in CELERY_BROKER_URL (redis://…); .ci/run sets one")
    if not _listening(RABBITMQ_URL):
        pytest.skip(f"needs RabbitMQ at {RABBITMQ_URL} (.ci/run starts it)")
    python = str(clean_venv / "bin/python")
    freeze = subprocess.run(
        [python, "-m", "pip", "freeze"], capture_output=True, text=True, check=True
    ).stdout
    assert "pytest" not in freeze and "ruff" not in freeze  # no dev tool came along to pull anything in

    base = _env(clean_venv, postgres_database, redis_url)
    for command in (["migrate", "--no-input", "-v", "0"], ["check", "--fail-level", "ERROR"]):
        done = subprocess.run(
            [python, "manage.py", *command], cwd=ROOT, env=base, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]

    server = AppServer(tmp_path, base, python=python).start()
    try:
        ready = httpx.get(f"{server.url}/readyz", timeout=10)
        assert ready.status_code == 200, ready.text
    finally:
        server.stop()

    for name, broker in (("redis", redis_url), ("rabbitmq", RABBITMQ_URL)):
        env = {**base, "CELERY_BROKER_URL": broker}
        worker = celery(tmp_path, env, f"clean-{name}", python=python).start()
        try:
            assert wait_for(lambda w=worker: "ready." in w.log() or not w.alive(), 60), worker.log()[-3000:]
            assert worker.alive(), worker.log()[-3000:]
            sent = subprocess.run(
                [
                    python,
                    "-c",
                    "import django; django.setup(); from claims.tasks import reap_expired_leases; "
                    "print(reap_expired_leases.delay().id)",
                ],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            job = sent.stdout.strip().splitlines()[-1]
            done_line = re.compile(rf"Task claims\.reap_expired_leases\[{job}\] succeeded")
            assert wait_for(lambda w=worker, d=done_line: bool(d.search(w.log())), 60), worker.log()[-3000:]
        finally:
            worker.stop()
