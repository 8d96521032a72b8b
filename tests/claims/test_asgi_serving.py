"""The production server (gunicorn with uvicorn workers, deploy/gunicorn.conf.py) on the test database: the worker
path answers under ASGI, and idle waiting claims hold no thread each — a suspended coroutine apiece (claim-v1.md §9,
claims/waiting.py). Threads are counted in the server process's /proc status."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.db import connection

from claims.models import Task
from tests.support.actors import ensure_default_namespace, make_actor

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def asgi_server():
    ensure_default_namespace()
    db = connection.settings_dict
    port = _free_port()
    env = {
        **os.environ,
        # the production profile of the suite's own (the whole control plane, or the core alone)
        "DJANGO_SETTINGS_MODULE": {"controlplane.settings.test_core": "controlplane.settings.core"}.get(
            settings.SETTINGS_MODULE, "controlplane.settings"
        ),
        "DATABASE_URL": f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "DATABASE_POOL": "true",
        "API_RATE_LIMIT": "",
        "BIND": f"127.0.0.1:{port}",
        "WEB_CONCURRENCY": "1",
    }
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "-c",
            str(ROOT / "deploy/gunicorn.conf.py"),
            "controlplane.asgi:application",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(150):
            try:
                httpx.get(f"{url}/api/v1/schema/", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        worker_pid = int(subprocess.check_output(["pgrep", "-P", str(server.pid)]).split()[0])
        yield url, worker_pid
    finally:
        server.terminate()
        server.wait(30)


def _threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Threads:")).split()[1])


def test_idle_waiters_hold_no_thread_each_and_one_task_ends_one_wait(asgi_server):
    url, pid = asgi_server
    operator = make_actor("olivia-operator", "operator")
    worker = make_actor("asgi-worker", "worker")
    body = {"owner_id": worker.name, "scheduler_epoch": 1, "ttl_seconds": 30, "wait_seconds": 15}

    async def scenario():
        async with httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {worker.token}"}, timeout=40
        ) as http:
            waits = [asyncio.create_task(http.post("/api/v1/claims", json=body)) for _ in range(60)]
            await asyncio.sleep(3)
            during = _threads(pid)
            task_id = await asyncio.to_thread(lambda: operator.create().json()["task_id"])
            done, pending = await asyncio.wait(waits, timeout=5, return_when=asyncio.FIRST_COMPLETED)
            first = [t.result() for t in done]
            for t in pending:
                t.cancel()
            return during, task_id, first

    during, task_id, first = asyncio.run(scenario())

    assert during < 30, f"{during} threads for 60 waiting claims"
    assert [r.status_code for r in first] == [200] and first[0].json()["task_id"] == task_id
    assert Task.objects.get(pk=task_id).owner_id == "asgi-worker"
