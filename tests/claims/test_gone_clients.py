"""Issue 21, 6 — a waiting claim whose client hung up keeps nothing: under ASGI (gunicorn + uvicorn) and under WSGI
(gunicorn's threaded workers, Django's runserver) a waiter whose client is gone leaves the queue, so the task goes to
a waiter still there. Before, under WSGI, the gone client's waiter — queued first — was woken and claimed, and the
task sat out its lease. Real server processes on the test database; the records asserted are the rows."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from django.db import connection

from claims.models import Attempt, Task
from deploy.topology import AppServer
from tests.support.actors import ensure_default_namespace, make_actor
from tests.support.processes import running_server, server_env
from tests.support.races import run_in_thread

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[2]
BOUND = 3.0


@contextmanager
def _server(kind: str, tmp_path: Path) -> Iterator[str]:
    if kind == "runserver":
        with running_server(DATABASE_POOL="false") as url:
            yield url
        return
    server = AppServer(tmp_path, server_env(), asgi=kind == "asgi").start()
    try:
        yield server.url
    finally:
        server.stop()


def _listeners() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'claims-listener'"
        )
        return cursor.fetchone()[0]


def _send_waiting_claim(url: str, token: str, owner: str) -> socket.socket:
    """A claim-next with a 20 s wait, sent by hand on a raw socket (so the test can hang up on it)."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"owner_id": owner, "scheduler_epoch": 1, "ttl_seconds": 30, "wait_seconds": 20})
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        (
            f"POST /api/v1/claims HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
        ).encode()
    )
    return sock


@pytest.mark.parametrize("kind", ["asgi", "gunicorn-wsgi", "runserver"])
def test_a_waiter_whose_client_hung_up_keeps_nothing_and_the_task_goes_to_one_still_there(tmp_path, kind):
    ensure_default_namespace()
    operator = make_actor("olivia-operator", "operator")
    gone, healthy = make_actor("gone-worker", "worker"), make_actor("healthy-worker", "worker")
    with _server(kind, tmp_path) as url:
        sock = _send_waiting_claim(url, gone.token, gone.name)
        deadline = time.monotonic() + 10  # the server's listener starts when its first waiter queues
        while _listeners() < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _listeners() >= 1
        sock.close()  # the client hangs up while its claim waits

        body = {"owner_id": healthy.name, "scheduler_epoch": 1, "ttl_seconds": 30, "wait_seconds": 20}
        thread, box = run_in_thread(
            lambda: (
                httpx.post(
                    f"{url}/api/v1/claims",
                    json=body,
                    headers={"Authorization": f"Bearer {healthy.token}"},
                    timeout=40,
                ),
                time.monotonic(),
            )
        )
        time.sleep(1.0)  # the healthy waiter queues behind the gone one (if that one is still queued)
        created = time.monotonic()
        task_id = operator.create().json()["task_id"]
        thread.join(40)

    answer, answered = box["value"]
    assert answer.status_code == 200 and answer.json()["task_id"] == task_id, answer.content
    assert answered - created < BOUND
    assert Task.objects.get(pk=task_id).owner_id == healthy.name
    assert not Attempt.objects.filter(owner_id=gone.name, ended_at__isnull=True).exists()
