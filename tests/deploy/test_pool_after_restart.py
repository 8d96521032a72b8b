"""Issue 21, 6 — a PostgreSQL restart costs no 503 beyond the requests in flight: the production server's connection
pool checks a connection before it hands it out (psycopg_pool's ``check``), so the connections the restart killed
are replaced instead of each failing one request. Before, the pooled server answered one 503 per stale connection."""

from __future__ import annotations

import httpx
import pytest
from django.db import connection

from tests.support.actors import ensure_default_namespace, make_actor
from tests.support.processes import can_restart_postgres, restart_postgres

pytestmark = [pytest.mark.postgres, pytest.mark.serial, pytest.mark.django_db(transaction=True)]


def test_no_503_after_a_restart_once_postgres_answers(app_servers):
    if not can_restart_postgres():
        pytest.skip("restarting PostgreSQL needs root and a Debian cluster (CI has both)")
    ensure_default_namespace()
    worker = make_actor("pool-worker", "worker")
    server = app_servers(DATABASE_POOL_MIN="4", DATABASE_POOL_MAX="4", TOKEN_CACHE_SECONDS="0")
    headers = {"Authorization": f"Bearer {worker.token}"}
    body = {"owner_id": worker.name, "scheduler_epoch": 1, "ttl_seconds": 30}
    with httpx.Client(base_url=server.url, headers=headers, timeout=10) as http:
        # Every pooled connection used at least once (several at a time), so the pool holds 4 open sessions.
        for _ in range(20):
            assert http.post("/api/v1/claims", json=body).status_code == 204

        restart_postgres()  # nothing in flight: every pooled session dies idle
        connection.close()

        statuses = [http.post("/api/v1/claims", json=body).status_code for _ in range(12)]

    assert statuses == [204] * 12, statuses
