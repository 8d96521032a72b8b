"""The production server (gunicorn with uvicorn workers, deploy/gunicorn.conf.py) on the test database: the worker
path answers under ASGI, and idle waiting claims hold no thread each — a suspended coroutine apiece (claim-v1.md §9,
claims/waiting.py). Threads are counted in the server process's /proc status."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from claims.models import Task
from tests.support.actors import ensure_default_namespace, make_actor

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def asgi_server(app_servers):
    ensure_default_namespace()
    server = app_servers()
    return server.url, server.worker_pids()[0]


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
