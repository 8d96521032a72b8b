"""Each request's thread for Django's thread-sensitive work is lent from the process's idle ones
(controlplane/request_threads.py): one thread per request as Django gives, none started per request.

In process, the lending itself; then the production server (gunicorn, uvicorn workers) on the test database, where
the threads the machine started while 200 API requests were served are counted by the kernel's last PID
(``/proc/sys/kernel/ns_last_pid``: every thread takes one). Django's own per-request context started two a request
(its thread, and one to join it on the way out)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import httpx
import pytest
from asgiref.sync import ThreadSensitiveContext, sync_to_async

from claims.models import Task
from controlplane.request_threads import Lender, _Loan, request_thread
from tests.support.actors import ensure_default_namespace, make_actor


def _ident() -> int:
    return threading.get_ident()


def _run(scenario) -> tuple:
    """``asyncio.run(scenario())`` on a thread of its own (another test may have left this one's loop running);
    the result and that thread's ident."""
    result: dict = {}

    def run() -> None:
        result["value"] = asyncio.run(scenario())
        result["thread"] = threading.get_ident()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    return result["value"], result["thread"]


async def _request(lender: Lender, gate: asyncio.Event | None = None) -> tuple[int, int, int]:
    """A request's thread-sensitive calls: before a pause, after it, and inside Django's own context."""
    async with request_thread(lender):
        first = await sync_to_async(_ident)()
        if gate is not None:
            await gate.wait()
        second = await sync_to_async(_ident)()
        async with ThreadSensitiveContext():  # as Django's handler enters one inside ours
            third = await sync_to_async(_ident)()
    return first, second, third


def test_requests_one_after_another_run_on_one_lent_thread():
    lender = Lender(idle=4)

    async def scenario():
        return [await _request(lender) for _ in range(20)]

    threads, loop_thread = _run(scenario)

    assert {t for request in threads for t in request} == {threads[0][0]}
    assert threads[0][0] != loop_thread
    assert (lender.started, lender.idle()) == (1, 1)


def test_requests_at_once_each_keep_a_thread_of_their_own_and_the_idle_ones_are_bounded():
    lender = Lender(idle=2)

    async def scenario():
        gate = asyncio.Event()
        running = [asyncio.create_task(_request(lender, gate)) for _ in range(5)]
        await asyncio.sleep(0.2)
        gate.set()
        return await asyncio.gather(*running)

    threads, _ = _run(scenario)

    assert all(len(set(request)) == 1 for request in threads)  # one request, one thread
    assert len({request[0] for request in threads}) == 5  # no two requests share one
    assert (lender.started, lender.idle()) == (5, 2)


def test_a_thread_still_busy_when_its_request_ended_is_not_lent_again():
    lender = Lender(idle=4)
    loan = _Loan(lender)
    release = threading.Event()
    busy = loan.submit(release.wait, 5)

    loan.give_back()

    assert lender.idle() == 0 and not busy.done()
    release.set()
    assert busy.result(5) is True
    again = _Loan(lender)
    again.submit(_ident).result(5)
    assert lender.started == 2


def _last_pid() -> int:
    return int(Path("/proc/sys/kernel/ns_last_pid").read_text())


@pytest.mark.serial  # counts every thread the machine starts: nothing else may run meanwhile
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_server_starts_no_thread_per_api_request(app_servers):
    ensure_default_namespace()
    operator = make_actor("olivia-operator", "operator")
    worker = make_actor("threads-worker", "worker")
    server = app_servers()
    tasks = [operator.create(node_id="n", input={"i": i}).json()["task_id"] for i in range(60)]
    headers = {"Authorization": f"Bearer {worker.token}"}
    claim = {"owner_id": worker.name, "scheduler_epoch": 1, "ttl_seconds": 60}

    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:

        def cycle() -> None:
            granted = http.post("/api/v1/claims", json=claim).json()
            body = worker.commit_body(granted, {"ok": True}, inline=True)
            assert http.post(f"/api/v1/tasks/{granted['task_id']}/commit", json=body).status_code == 200
            assert http.get(f"/api/v1/tasks/{granted['task_id']}").status_code == 200  # a sync view

        for _ in range(10):  # the pool's connections and the lent threads, made once
            cycle()
        before = _last_pid()
        for _ in range(50):
            cycle()
        started = _last_pid() - before

    assert Task.objects.filter(pk__in=tasks, state="COMMITTED").count() == 60
    assert started < 50, f"{started} threads or processes started for 150 requests"
